"""`opsloop run` supervises what it starts: a dead child is restarted with back-off within a budget,
beyond it everything stops naming the child; `opsloop run --stop` (make stop) ends `opsloop run` itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from opsloop.lab.pipeline import LabPorts, pipeline_processes, run_pidfile
from opsloop.stack import ManagedProcess, free_port
from opsloop.stack.process import pid_alive
from opsloop.stack.supervisor import RestartBudgetExceeded, Supervisor
from tests.helpers import REPO, wait_until, write_config


def sleeper(tmp: Path, name: str = "sleeper") -> ManagedProcess:
    return ManagedProcess(name=name, argv=["sleep", "600"], workdir=tmp / name)


def test_dead_child_is_reaped_restarted_and_reported(tmp_path: Path) -> None:
    proc, other = sleeper(tmp_path), sleeper(tmp_path, "other")
    proc.start()
    other.start()
    said: list[str] = []
    sup = Supervisor([proc, other], backoff_s=0.05, echo=said.append)
    try:
        assert sup.check() == []
        first = proc.proc.pid  # type: ignore[union-attr]
        os.kill(first, signal.SIGKILL)
        events = wait_until(lambda: sup.check(), timeout=60, interval=0.05, what="restart of the killed child")
        assert [e.name for e in events] == ["sleeper"] and events[0].exit_code == -signal.SIGKILL
        assert proc.running() and proc.proc.pid != first  # type: ignore[union-attr]
        # Reaped: the old PID is gone, not a zombie held by the supervisor.
        assert not pid_alive(first)
        assert any("sleeper exited (code -9)" in s for s in said) and any("sleeper restarted" in s for s in said)
        assert other.running() and [e.name for e in sup.events] == ["sleeper"]
    finally:
        proc.stop()
        other.stop()


def test_restart_budget_exceeded_names_the_child(tmp_path: Path) -> None:
    crasher = ManagedProcess(name="crasher", argv=[sys.executable, "-c", "print('bad config x'); raise SystemExit(3)"],
                             workdir=tmp_path / "crasher")
    crasher.start()
    sup = Supervisor([crasher], max_restarts=3, window_s=300, backoff_s=0.01, max_backoff_s=0.05, echo=lambda _: None)

    def gave_up() -> str | None:
        try:
            sup.check()
        except RestartBudgetExceeded as e:
            return str(e)
        return None

    msg = wait_until(gave_up, timeout=60, interval=0.05, what="the supervisor to give up")
    assert "crasher died 4 times within 300 s (exit code 3)" in msg and "bad config x" in msg
    assert len(sup.events) == 3


def test_exit_code_of_a_child_that_dies_between_the_two_looks(tmp_path: Path) -> None:
    # poll() says "running", then the child exits before the pidfile check sees a zombie: the code
    # must still be read (the race that made "exit code None" show up under load)
    crasher = ManagedProcess(name="crasher", argv=[sys.executable, "-c", "raise SystemExit(3)"],
                             workdir=tmp_path / "crasher")
    crasher.start()
    assert crasher.proc is not None
    wait_until(lambda: not pid_alive(crasher.proc.pid), timeout=30, interval=0.02, what="the child to exit")
    sup = Supervisor([crasher], echo=lambda _: None)
    crasher.proc.poll = lambda: None  # type: ignore[method-assign]  # the look taken just before it exited
    assert sup.alive(sup.children["crasher"]) is False
    assert sup.children["crasher"].exit_code == 3


def test_backoff_doubles_per_recent_restart(tmp_path: Path) -> None:
    now = [1000.0]
    proc = sleeper(tmp_path)
    proc.start()
    sup = Supervisor([proc], backoff_s=2.0, max_backoff_s=5.0, echo=lambda _: None, clock=lambda: now[0])
    try:
        delays = []
        for _ in range(3):
            proc.kill()
            assert sup.check() == []           # noticed; waits for its back-off
            child = sup.children["sleeper"]
            delays.append(child.restart_at - now[0])
            now[0] = child.restart_at
            assert [e.name for e in sup.check()] == ["sleeper"]
        assert delays == [2.0, 4.0, 5.0]        # doubled, capped
    finally:
        proc.stop()


def test_process_list_is_derived_and_building_it_has_no_side_effects(tmp_path: Path) -> None:
    from opsloop.lab.pipeline import effective_config

    inventory = tmp_path / "bmcs" / "inventory.yaml"
    inventory.parent.mkdir(parents=True)
    inventory.write_text("kept")
    settings, cfg = effective_config(None, tmp_path, LabPorts.free())
    names = [p.name for p in pipeline_processes(settings, cfg, tmp_path, 1.0)]
    assert inventory.read_text() == "kept"
    assert not (tmp_path / "lab").exists()  # HAProxy's config is written when it starts, not listed
    for n in ("haproxy", "traffic", "bmcs", "pager", "stream-worker", "collector-haproxy", "collector-ipmi",
              "paging", "edge-control", "actuator"):
        assert n in names
    assert len(set(names)) == len(names)


@pytest.mark.integration
def test_make_stop_ends_make_run_and_a_killed_child_comes_back(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "opsloop.yaml", {
        "stack": {"data_dir": str(tmp_path / "stack"), "kafka_port": free_port(), "kafka_controller_port": free_port(),
                  "prometheus_port": free_port(), "alertmanager_port": free_port(), "scrape_targets": []},
        "stream": {"metrics_port": free_port(), "web_port": free_port()},
        "collector": {"metrics_port": free_port()}})
    args = ["--config", str(cfg), "--run-dir", str(run_dir)]
    log = (tmp_path / "run.out").open("wb")
    run = subprocess.Popen([sys.executable, "-m", "opsloop.cli", "run", "--free-ports", "--traffic-rate", "5", *args],
                           cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    out = lambda: (tmp_path / "run.out").read_text(errors="replace")  # noqa: E731
    try:
        wait_until(lambda: "opsloop is running." in out() or run.poll() is not None, timeout=420, interval=1,
                   what="`opsloop run` to start everything")
        assert run.poll() is None, out()
        assert run_pidfile(run_dir).read_pid()[0] == run.pid  # type: ignore[index]
        traffic = ManagedProcess(name="traffic", argv=[], workdir=run_dir / "traffic")
        old = traffic.read_pid()
        assert old is not None
        os.killpg(old[0], signal.SIGKILL)
        wait_until(lambda: "traffic restarted" in out(), timeout=120, what="the supervisor to restart the traffic")
        assert traffic.running() and traffic.read_pid() != old
        pids = [p.read_pid() for p in (traffic, ManagedProcess(name="kafka", argv=[], workdir=tmp_path / "stack" / "kafka"))]

        stop = subprocess.run([sys.executable, "-m", "opsloop.cli", "run", "--stop", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=400)
        assert stop.returncode == 0, stop.stderr
        # `make run` itself has exited (no zombies left behind: it reaped its children), and so has every child.
        assert run.wait(timeout=60) == 0, out()
        assert all(rec is not None and not pid_alive(*rec) for rec in pids)
        assert "stopped" in out() and not run_pidfile(run_dir).pidfile.exists()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        subprocess.run([sys.executable, "-m", "opsloop.cli", "run", "--stop", *args], cwd=REPO, capture_output=True,
                       timeout=400)
        log.close()
