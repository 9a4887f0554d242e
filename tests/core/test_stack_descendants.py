"""A managed child's descendants in sessions of their own (the lab's BMC simulator starts each `ipmi_sim`
so) are stopped with it: when the child is stopped, and when it dies by SIGKILL and the supervisor
restarts it. Before, a `kill -9` of the BMC simulator left its six `ipmi_sim` running after `make stop`."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from opsloop.stack import ManagedProcess
from opsloop.stack.process import pid_alive
from opsloop.stack.supervisor import RestartBudgetExceeded, Supervisor
from tests.helpers import wait_until

# A parent that starts a grandchild in a new session and never stops it (SIGTERM's default action ends the
# parent alone), as a simulator whose clean-up is skipped.
PARENT = """
import subprocess, sys, time
g = subprocess.Popen(["sleep", "600"], start_new_session=True)
open(sys.argv[1] + ".tmp", "w").write(str(g.pid))
__import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def parent(tmp: Path, name: str = "parent") -> tuple[ManagedProcess, Path]:
    marker = tmp / f"{name}.grandchild"
    proc = ManagedProcess(name=name, argv=[sys.executable, "-c", PARENT, str(marker)], workdir=tmp / name,
                          ready=marker.exists, ready_timeout_s=60)
    return proc, marker


def grandchild_of(marker: Path) -> int:
    return int(marker.read_text())


def test_stop_ends_descendants_in_their_own_session(tmp_path: Path) -> None:
    proc, marker = parent(tmp_path)
    proc.start()
    grandchild = grandchild_of(marker)
    try:
        assert pid_alive(grandchild)
        # A fresh handle, as `opsloop run --stop` builds one from the pidfile.
        ManagedProcess(name=proc.name, argv=[], workdir=proc.workdir).stop()
        proc.proc.wait(timeout=30)  # type: ignore[union-attr]
        wait_until(lambda: not pid_alive(grandchild), timeout=30, interval=0.05, what="the grandchild to be stopped")
        assert not proc.pidfile.exists()
    finally:
        if pid_alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)
        proc.stop()


def test_supervisor_restart_ends_the_orphans_of_a_sigkilled_child(tmp_path: Path) -> None:
    proc, marker = parent(tmp_path)
    proc.start()
    first, orphan = proc.proc.pid, grandchild_of(marker)  # type: ignore[union-attr]
    sup = Supervisor([proc], backoff_s=0.05, echo=lambda _: None)
    new_grandchild: int | None = None
    try:
        assert sup.check() == []           # the supervisor sees the child alive, with its descendants
        marker.unlink()
        os.kill(first, signal.SIGKILL)    # `kill -9 PID`: the grandchild is orphaned, out of the group
        wait_until(lambda: sup.check(), timeout=60, interval=0.05, what="the restart of the killed child")
        new_grandchild = grandchild_of(marker)
        assert not pid_alive(orphan), "the SIGKILLed child's grandchild outlived its restart"
        assert pid_alive(new_grandchild) and proc.running()
    finally:
        for pid in (orphan, new_grandchild):
            if pid is not None and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.stop()


def test_supervisor_giving_up_ends_the_orphans_of_the_dead_child(tmp_path: Path) -> None:
    proc, marker = parent(tmp_path)
    proc.start()
    orphan = grandchild_of(marker)
    sup = Supervisor([proc], max_restarts=0, echo=lambda _: None)
    try:
        assert sup.check() == []
        os.kill(proc.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]

        def gave_up() -> bool:
            try:
                sup.check()
            except RestartBudgetExceeded:
                return True
            return False

        wait_until(gave_up, timeout=60, interval=0.05, what="the supervisor to give up")
        # `opsloop run` then stops everything with fresh handles, which know nothing of the orphan
        ManagedProcess(name=proc.name, argv=[], workdir=proc.workdir).stop()
        assert not pid_alive(orphan), "the dead child's grandchild outlived the supervisor giving up"
    finally:
        if pid_alive(orphan):
            os.kill(orphan, signal.SIGKILL)
        proc.stop()
