"""Keeps a set of managed processes running: a child that dies is restarted with back-off, within a budget.

`opsloop run` (and the chaos soak) hand their processes to a :class:`Supervisor` and call :meth:`check`
from their main loop. A dead child is reaped (no zombies), restarted after a back-off that doubles per
recent restart, and each restart is printed and logged. More than ``max_restarts`` restarts of one child
within ``window_s`` means it cannot stay up: :meth:`check` raises :class:`RestartBudgetExceeded`
naming it, and the caller stops everything.
"""

from __future__ import annotations

import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from opsloop.log import get_logger
from opsloop.stack.process import ManagedProcess, StackError

log = get_logger("supervisor")


class RestartBudgetExceeded(StackError):
    """One child died more often than the restart budget allows."""


@dataclass
class RestartEvent:
    name: str
    died_at: float          # monotonic time the death was noticed
    exit_code: int | None
    restarted_at: float     # monotonic time the child was ready again
    attempt: int            # restarts of this child within the window, this one included


@dataclass
class _Child:
    proc: ManagedProcess
    restarts: deque[float] = field(default_factory=deque)  # monotonic times of recent restarts
    down_since: float | None = None
    exit_code: int | None = None
    restart_at: float = 0.0


class Supervisor:
    def __init__(self, procs: list[ManagedProcess], max_restarts: int = 5, window_s: float = 300.0,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 echo: Callable[[str], None] = lambda msg: print(msg, flush=True),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.children = {p.name: _Child(p) for p in procs}
        self.max_restarts, self.window_s = max_restarts, window_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.echo, self.clock = echo, clock
        self.events: list[RestartEvent] = []

    def add(self, proc: ManagedProcess) -> None:
        self.children[proc.name] = _Child(proc)

    def alive(self, child: _Child) -> bool:
        p = child.proc
        if p.proc is None:  # not started by us: only the pidfile tells
            return p.running()
        if p.proc.poll() is None and p.running():
            return True
        # Dead. It may have exited between poll() and the pidfile check (a zombie then, not yet
        # reaped): wait() reaps it and gives its exit code, which poll() had not seen.
        try:
            child.exit_code = p.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:  # still running, but its pidfile is gone or stale
            child.exit_code = None
        return False

    def check(self) -> list[RestartEvent]:
        """Notice dead children and restart those whose back-off has passed; returns the restarts done."""
        done: list[RestartEvent] = []
        now = self.clock()
        for name, child in self.children.items():
            if child.down_since is None:
                if self.alive(child):
                    child.proc.remember_descendants()   # stopped at its restart if it dies by SIGKILL
                    continue
                child.down_since = now
                while child.restarts and now - child.restarts[0] > self.window_s:
                    child.restarts.popleft()
                if len(child.restarts) >= self.max_restarts:
                    msg = (f"{name} died {len(child.restarts) + 1} times within {self.window_s:.0f} s "
                           f"(exit code {child.exit_code}); giving up. Last lines of {child.proc.logfile}:\n"
                           f"{child.proc.tail()}")
                    log.error("supervisor.gave_up", process=name, exit_code=child.exit_code,
                              restarts=len(child.restarts), window_s=self.window_s)
                    child.proc.stop()   # its orphans: the caller's stop-all builds handles that never saw them
                    raise RestartBudgetExceeded(msg)
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** len(child.restarts))
                child.restart_at = now + delay
                self.echo(f"{name} exited (code {child.exit_code}); restarting in {delay:.1f} s "
                          f"(restart {len(child.restarts) + 1} of at most {self.max_restarts} "
                          f"in {self.window_s:.0f} s); log {child.proc.logfile}")
                log.warning("supervisor.child_exited", process=name, exit_code=child.exit_code,
                            restart_in_s=delay, attempt=len(child.restarts) + 1)
            if now < child.restart_at:
                continue
            ev = self._restart(name, child)
            if ev is not None:
                done.append(ev)
        return done

    def _restart(self, name: str, child: _Child) -> RestartEvent | None:
        died_at, code = child.down_since or self.clock(), child.exit_code
        child.proc.stop()              # clears the stale pidfile, leftovers of its group and its orphans
        child.restarts.append(self.clock())
        try:
            child.proc.start()
        except StackError as e:        # retried after the longest back-off, within the same budget
            self.echo(f"{name}: restart failed: {e}")
            log.error("supervisor.restart_failed", process=name, error=str(e).splitlines()[0])
            if len(child.restarts) >= self.max_restarts:
                raise RestartBudgetExceeded(f"{name} could not be restarted: {e}") from None
            child.restart_at = self.clock() + self.max_backoff_s
            return None
        child.down_since, child.exit_code = None, None
        ev = RestartEvent(name, died_at, code, self.clock(), len(child.restarts))
        self.events.append(ev)
        pid = child.proc.proc.pid if child.proc.proc else "?"
        self.echo(f"{name} restarted (pid {pid}, {ev.restarted_at - ev.died_at:.1f} s after it was found dead)")
        log.info("supervisor.child_restarted", process=name, attempt=ev.attempt,
                 down_s=round(ev.restarted_at - ev.died_at, 3))
        return ev
