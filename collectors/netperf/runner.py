"""Running a measurement tool: explicit argv (no shell), a hard timeout, bounded output, bounded
concurrency, and the whole process group killed on timeout so that nothing is ever left behind.

Each tool runs in its own session (``start_new_session``): its pid is its process group id, so one
``killpg`` reaches anything it forked. netperf hangs forever when the netserver accepts the control
connection but does not answer (a stopped or overloaded host), and ``netperf -l 0.5`` is read as
``-l 0`` (no end), so the deadline is what bounds a round, not the tool.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import IO, Sequence

# Enough for any netperf/iperf3 result; a tool that floods stdout is cut off, not buffered.
OUTPUT_LIMIT = 1 << 20
# After SIGKILL, how long to wait for the pipes to close (a grandchild that left the group keeps them open).
_REAP_GRACE_S = 2.0
# C locale: decimal points in numbers whatever the host's locale.
_ENV_OVERRIDES = {"LC_ALL": "C", "LANG": "C"}


@dataclass(frozen=True, slots=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int | None  # None when killed on timeout
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float

    @property
    def output(self) -> str:
        """stdout and stderr together (netperf prints its errors on stdout)."""
        return "\n".join(part for part in (self.stdout.strip(), self.stderr.strip()) if part)


class ToolMissing(FileNotFoundError):
    """The executable could not be started."""


def _drain(stream: IO[bytes], sink: bytearray, limit: int) -> None:
    # Keep reading past the limit so the tool never blocks on a full pipe; just drop the excess.
    while True:
        chunk = stream.read(65536)
        if not chunk:
            break
        room = limit - len(sink)
        if room > 0:
            sink.extend(chunk[:room])
    stream.close()


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` exits or ``deadline`` (monotonic) passes, without reaping it (WNOWAIT).
    Returns True if it exited."""
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(0.02, remaining))


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _group_members_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` is still running (zombies do not count)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _wait_group_dead(pgid: int, grace_s: float) -> None:
    # SIGKILL is delivered asynchronously: a member can still be running for a moment after killpg
    # returns (longer on a loaded machine). Waiting here makes "nothing it started is still running
    # when run() returns" a guarantee rather than a likelihood.
    deadline = time.monotonic() + grace_s
    while _group_members_alive(pgid) and time.monotonic() < deadline:
        kill_group(pgid)
        time.sleep(0.01)


class Runner:
    """Runs tools with at most ``max_processes`` alive at once (callers beyond that wait their turn)."""

    def __init__(self, max_processes: int = 32, output_limit: int = OUTPUT_LIMIT) -> None:
        self._slots = threading.BoundedSemaphore(max_processes)
        self._output_limit = output_limit
        self._lock = threading.Lock()
        self._alive: set[int] = set()
        self.peak = 0

    @property
    def alive(self) -> int:
        with self._lock:
            return len(self._alive)

    def run(self, argv: Sequence[str], timeout_s: float) -> Completed:
        """Run ``argv`` to completion or until ``timeout_s``; raises ToolMissing if it cannot start."""
        with self._slots:
            return self._run(tuple(argv), timeout_s)

    def _run(self, argv: tuple[str, ...], timeout_s: float) -> Completed:
        env = {**os.environ, **_ENV_OVERRIDES}
        started = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, env=env)
        except OSError as e:
            # Not only missing: ENOEXEC (a script without #!), EAGAIN (no process slot) ... each a per-target
            # error; raised past the collector it lost the whole round, the other sets' samples too.
            raise ToolMissing(f"cannot run {argv[0]!r}: {e.strerror or e}") from None
        with self._lock:
            self._alive.add(proc.pid)
            self.peak = max(self.peak, len(self._alive))
        out, err = bytearray(), bytearray()
        readers = [threading.Thread(target=_drain, args=(proc.stdout, out, self._output_limit), daemon=True),
                   threading.Thread(target=_drain, args=(proc.stderr, err, self._output_limit), daemon=True)]
        for t in readers:
            t.start()
        timed_out = False
        try:
            timed_out = not _wait_unreaped(proc.pid, started + max(timeout_s, 0.0))
        finally:
            # Always: on timeout to stop the tool, after a normal exit to catch anything it forked.
            # The leader is not reaped yet, so its pid (= the group id) cannot have been reused.
            kill_group(proc.pid)
            _wait_group_dead(proc.pid, _REAP_GRACE_S)
            proc.wait()
            for t in readers:
                t.join(_REAP_GRACE_S)
            with self._lock:
                self._alive.discard(proc.pid)
        return Completed(argv=argv, returncode=None if timed_out else proc.returncode,
                         stdout=out.decode("utf-8", "backslashreplace"),
                         stderr=err.decode("utf-8", "backslashreplace"),
                         timed_out=timed_out, duration_s=time.monotonic() - started)
