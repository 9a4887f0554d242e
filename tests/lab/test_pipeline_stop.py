"""`opsloop run --stop` (make stop) ends every process `opsloop run` starts: what it stops is derived from
the same list, so a process added to that list cannot outlive `make stop`."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.lab import pipeline
from opsloop.lab.pipeline import LabPorts, effective_config, started_process_names, stop_running
from opsloop.stack import ManagedProcess, Stack
from opsloop.stack.process import pid_alive
from tests.helpers import write_config


def stand_in(like: ManagedProcess) -> tuple[int, str | None]:
    """A live process recorded where ``like`` keeps its pidfile (what `--stop` reads): no component needed."""
    proc = ManagedProcess(name=like.name, argv=["sleep", "600"], workdir=like.workdir)
    proc.start()
    rec = proc.read_pid()
    assert rec is not None and pid_alive(*rec)
    return rec


def test_stop_ends_every_listed_process_including_one_added_to_the_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    base = write_config(tmp_path / "base.yaml", {"stack": {"data_dir": str(tmp_path / "stack")}})
    settings, cfg = effective_config(base, run_dir, LabPorts.free())

    listed = pipeline.pipeline_processes

    def with_newcomer(*args: object, **kwargs: object) -> list[ManagedProcess]:
        procs = listed(*args, **kwargs)  # type: ignore[arg-type]
        return [*procs, ManagedProcess(name="newcomer", argv=["true"], workdir=run_dir / "newcomer")]

    monkeypatch.setattr(pipeline, "pipeline_processes", with_newcomer)
    stack = Stack(settings.stack)
    handles = [stack.component(n) for n in stack.component_names()]
    handles += pipeline.pipeline_processes(settings, cfg, run_dir, 0.0)
    # the help's list (what `opsloop run` starts) is the same list
    assert [h.name for h in handles] == started_process_names()
    assert "newcomer" in started_process_names()

    live = {h.name: stand_in(h) for h in handles}
    try:
        stop_running(run_dir, settings, cfg, timeout_s=30)
        survivors = [name for name, rec in live.items() if pid_alive(*rec)]
        assert survivors == []
        assert not [h.name for h in handles if h.pidfile.exists()]
    finally:
        for h in handles:
            h.stop()
