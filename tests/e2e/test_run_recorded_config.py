"""`opsloop run` keeps to the config a running pipeline was started with (its run dir's opsloop.yaml):

- a second `opsloop run` (another `make run`, or one with another --config) is refused *before* it writes
  anything: it rewrote the running pipeline's opsloop.yaml, which its supervisor's restarts then read;
- `opsloop run --stop` (`make stop`) stops the stack that config names: it rebuilt the config from --config
  or the defaults, so a run started with another ``stack.data_dir`` kept Kafka, Prometheus and
  Alertmanager running after `make stop` (and the default stack, if one ran, was stopped instead)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.lab import pipeline
from opsloop.lab.pipeline import LabPorts, effective_config, run_pidfile
from opsloop.stack import ManagedProcess, Stack
from opsloop.stack.process import pid_alive
from tests.helpers import write_config

pytestmark = pytest.mark.integration


def stand_in(name: str, workdir: Path) -> ManagedProcess:
    """A live process whose pidfile is where ``name``'s is (what --stop and the already-running check read)."""
    proc = ManagedProcess(name=name, argv=["sleep", "600"], workdir=workdir)
    proc.start()
    rec = proc.read_pid()
    assert rec is not None and pid_alive(*rec)
    return proc


class StackUnderTmp(Stack):
    """Refuses to stop a stack outside the test's directory (the old code stopped the default one: `make run`'s)."""

    root: Path

    def down(self) -> None:
        data = Path(self.settings.data_dir)
        assert self.root in data.parents, f"--stop stopped the stack in {data}, not the running pipeline's"
        super().down()


def test_a_refused_second_run_leaves_the_running_config_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    base = write_config(tmp_path / "base.yaml", {"stack": {"data_dir": str(tmp_path / "stack")}})
    effective_config(base, run_dir, LabPorts.free())
    recorded = (run_dir / "opsloop.yaml").read_bytes()
    other = write_config(tmp_path / "other.yaml", {"stack": {"data_dir": str(tmp_path / "other-stack")},
                                                   "collector": {"interval_s": 1.0}})
    running = stand_in(run_pidfile(run_dir).name, run_dir)
    try:
        assert pipeline.main(["--run-dir", str(run_dir), "--config", str(other), "--free-ports"]) == 1
        assert (run_dir / "opsloop.yaml").read_bytes() == recorded
        assert running.running()
    finally:
        running.stop()


def test_stop_stops_the_stack_the_run_was_started_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    base = write_config(tmp_path / "base.yaml", {"stack": {"data_dir": str(tmp_path / "stack")}})
    settings, _ = effective_config(base, run_dir, LabPorts.free())
    monkeypatch.setattr(StackUnderTmp, "root", tmp_path, raising=False)
    monkeypatch.setattr(pipeline, "Stack", StackUnderTmp)
    stack = Stack(settings.stack)
    parts = [stand_in(c.name, c.workdir) for c in (stack.component(n) for n in stack.component_names())]
    try:
        # what `make stop` runs: no --config
        assert pipeline.main(["--stop", "--run-dir", str(run_dir)]) == 0
        assert [p.name for p in parts if p.running()] == []
        assert not [p.name for p in parts if p.pidfile.exists()]
    finally:
        for p in parts:
            p.stop()


def test_stop_with_an_unreadable_recorded_config_falls_back_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "opsloop.yaml").write_text("stack: [not, a, mapping\n")
    base = write_config(tmp_path / "base.yaml", {"stack": {"data_dir": str(tmp_path / "stack")}})
    settings = pipeline.load_settings(base, discover=False)
    monkeypatch.setattr(StackUnderTmp, "root", tmp_path, raising=False)
    monkeypatch.setattr(pipeline, "Stack", StackUnderTmp)
    kafka = Stack(settings.stack).component("kafka")
    part = stand_in(kafka.name, kafka.workdir)
    try:
        assert pipeline.main(["--stop", "--run-dir", str(run_dir), "--config", str(base)]) == 0
        assert not part.running()
        err = capsys.readouterr().err
        assert err.startswith("opsloop run --stop: ") and f"stopping by {base} instead" in err, err
    finally:
        part.stop()
