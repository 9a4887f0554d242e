"""A local process managed by PID: started in its own process group, stopped by PID, never by name.

The pidfile records the PID and the process's start time (from /proc), so a stale pidfile whose PID
was reused by another program is recognised and that program is left alone.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import orjson

from opsloop.log import get_logger

_log = get_logger("process")


class StackError(RuntimeError):
    """A component could not start or stop; the message names it and says what to do."""


def require_binary(name: str, hint: str = "run `make setup`") -> str:
    path = shutil.which(name)
    if path is None:
        raise StackError(f"{name}: binary not found on PATH; {hint}")
    return path


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


# Ports `make run` binds by default (opsloop.yaml's 28xxx/29xxx): never handed out as "free".
_DEFAULT_PORTS = range(28000, 30000)
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


# Where free_port picks ("LO-HI", HI excluded): runs sharing a machine (the test suite's parallel
# workers) each take their own slice, so neither picks a port the other is about to bind.
PORT_RANGE_ENV = "OPSLOOP_FREE_PORT_RANGE"


# free_port picks from here up to the ephemeral range (or `make run`'s defaults, for a slice)
_LOWEST_PORT = 10000


def port_range_slice(index: int, count: int) -> str:
    """``$OPSLOOP_FREE_PORT_RANGE`` for run ``index`` of ``count`` sharing a machine: its own part
    of the ports below `make run`'s defaults."""
    width = (_DEFAULT_PORTS.start - _LOWEST_PORT) // max(1, count)
    return f"{_LOWEST_PORT + index * width}-{_LOWEST_PORT + (index + 1) * width}"


def _port_candidates(lo_ephemeral: int) -> list[int]:
    """Ports free_port may pick: below the ephemeral range, outside `make run`'s defaults, and
    within ``$OPSLOOP_FREE_PORT_RANGE`` when that is set."""
    lo, hi = _LOWEST_PORT, lo_ephemeral
    spec = os.environ.get(PORT_RANGE_ENV, "").strip()
    if spec:
        try:
            lo, hi = (int(x) for x in spec.split("-", 1))
        except ValueError:
            raise StackError(f"${PORT_RANGE_ENV}={spec!r}: expected LO-HI, e.g. 10000-19000") from None
        if not 1024 <= lo < hi <= 65536:
            raise StackError(f"${PORT_RANGE_ENV}={spec!r}: need 1024 <= LO < HI <= 65536")
    ports = [p for p in range(lo, hi) if p not in _DEFAULT_PORTS and p < lo_ephemeral]
    if spec and not ports:
        raise StackError(f"${PORT_RANGE_ENV}={spec!r}: no port below the ephemeral range "
                         f"({lo_ephemeral}) outside {_DEFAULT_PORTS.start}-{_DEFAULT_PORTS.stop - 1}")
    return ports


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a server about to be started on it.

    Picked *below* the kernel's ephemeral range: every outgoing connection takes its local port from
    that range, so a port picked there (what ``bind(0)`` gives) can be taken by any client socket
    between this pick and the server's own bind, and the server then fails with "address in use"
    (seen as a Kafka broker that would not start while other tests were connecting). Random, checked
    by binding, never the same port twice in one process, and within ``$OPSLOOP_FREE_PORT_RANGE``.
    """
    lo = _ephemeral_range()[0]
    candidates = _port_candidates(lo)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(candidates) if candidates else 0
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        _handed_out.add(port)
        return port
    raise OSError(f"no free port found on {host} below the ephemeral range ({lo})"
                  + (f" in ${PORT_RANGE_ENV}" if os.environ.get(PORT_RANGE_ENV) else ""))


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat fields after the ")" that ends the command name (state first)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _proc_start_time(pid: int) -> str | None:
    stat = _proc_stat(pid)
    return stat[19] if stat else None  # field 22 of stat: starttime


def pid_alive(pid: int, start_time: str | None = None) -> bool:
    stat = _proc_stat(pid)
    if stat is None or stat[0] == "Z":
        return False
    return start_time is None or stat[19] == start_time


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's: a child started from a worker thread is listed there)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def descendants(pid: int) -> list[tuple[int, str]]:
    """Every live descendant of ``pid`` with its start time, those in a session of their own included:
    the simulated BMCs' ``ipmi_sim`` are, so a killpg of the child's group does not reach them."""
    out: list[tuple[int, str]] = []
    todo, seen = _children(pid), {pid}
    while todo:
        child = todo.pop()
        start = _proc_start_time(child)
        if child in seen or start is None:
            continue
        seen.add(child)
        out.append((child, start))
        todo += _children(child)
    return out


def terminate(procs: list[tuple[int, str]], timeout_s: float = 10.0) -> list[int]:
    """SIGTERM then, after ``timeout_s``, SIGKILL each (pid, start time) still alive; returns the PIDs signalled.
    The start time makes a PID reused by another program since safe: it is left alone."""
    alive = [(pid, start) for pid, start in procs if pid_alive(pid, start)]
    for pid, _ in alive:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(pid_alive(*p) for p in alive):
        time.sleep(0.05)
    for pid, start in alive:
        if pid_alive(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return [pid for pid, _ in alive]


def write_pidfile(path: Path, pid: int, argv: list[str] | None = None) -> None:
    """PID and start time (so a reused PID is recognised), written whole: temp file, then rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(orjson.dumps({"pid": pid, "start_time": _proc_start_time(pid), "argv": argv or []}))
    tmp.rename(path)


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[str, tuple[str, int]] = field(default_factory=dict)  # label -> (host, port) it will bind
    ready: Callable[[], bool] | None = None
    ready_timeout_s: float = 60.0
    stop_timeout_s: float = 20.0
    proc: subprocess.Popen[bytes] | None = None
    # Its descendants when last seen alive (the supervisor refreshes it): those that outlive a SIGKILLed
    # child, reparented to init and out of its process group, are still stopped by stop().
    known_descendants: list[tuple[int, str]] = field(default_factory=list)

    @property
    def pidfile(self) -> Path:
        return self.workdir / f"{self.name}.pid"

    @property
    def logfile(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def read_pid(self) -> tuple[int, str | None] | None:
        try:
            d = orjson.loads(self.pidfile.read_bytes())
            return int(d["pid"]), d.get("start_time")
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def running(self) -> bool:
        rec = self.read_pid()
        return rec is not None and pid_alive(*rec)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.running():
            return
        for label, (host, port) in self.ports.items():
            if port_in_use(host, port):
                raise StackError(
                    f"{self.name}: {label} port {host}:{port} is already in use; stop what listens there "
                    f"(ss -ltnp 'sport = :{port}') or choose another port in the config")
        log = open(self.logfile, "ab")
        env = {**os.environ, **self.env}
        try:
            self.proc = subprocess.Popen(self.argv, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        except FileNotFoundError:
            raise StackError(f"{self.name}: cannot execute {self.argv[0]}; run `make setup`") from None
        finally:
            log.close()
        write_pidfile(self.pidfile, self.proc.pid, self.argv)
        self.wait_ready()

    def wait_ready(self) -> None:
        if self.ready is None:
            return
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise StackError(f"{self.name}: exited with code {self.proc.returncode} during start-up; "
                                 f"last lines of {self.logfile}:\n{self.tail()}")
            try:
                if self.ready():
                    return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.2)
        self.stop()
        raise StackError(f"{self.name}: not ready after {self.ready_timeout_s:.0f} s; see {self.logfile}:\n{self.tail()}")

    def remember_descendants(self) -> None:
        """Record the live descendants now (a child killed with SIGKILL cannot stop its own any more)."""
        rec = self.read_pid()
        if rec is not None and pid_alive(*rec):
            self.known_descendants = descendants(rec[0])

    def reload(self) -> bool:
        """SIGHUP to the process (Prometheus and Alertmanager re-read their config file); False if not running."""
        rec = self.read_pid()
        if rec is None or not pid_alive(*rec):
            return False
        try:
            os.kill(rec[0], signal.SIGHUP)
        except ProcessLookupError:
            return False
        return True

    def stop(self) -> None:
        rec = self.read_pid()
        if rec is None:
            self._stop_leftovers([])
            return
        pid, start_time = rec
        tree: list[tuple[int, str]] = []
        if pid_alive(pid, start_time):
            tree = descendants(pid)
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + self.stop_timeout_s
            while time.monotonic() < deadline and pid_alive(pid, start_time):
                self._reap(pid)
                time.sleep(0.1)
            if pid_alive(pid, start_time):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                while pid_alive(pid, start_time):
                    self._reap(pid)
                    time.sleep(0.05)
        self._reap(pid)
        self._stop_leftovers(tree)
        self.pidfile.unlink(missing_ok=True)

    def _stop_leftovers(self, tree: list[tuple[int, str]]) -> None:
        """Descendants that outlived the child (own session, or orphaned by a SIGKILL): stopped by PID."""
        left = terminate(list(dict.fromkeys(tree + self.known_descendants)), timeout_s=self.stop_timeout_s)
        self.known_descendants = []
        if left:
            _log.warning("process.descendants_stopped", process=self.name, pids=left)

    def kill(self) -> None:
        """SIGKILL now (fault tests): no graceful shutdown."""
        rec = self.read_pid()
        if rec and pid_alive(*rec):
            os.killpg(rec[0], signal.SIGKILL)
            while pid_alive(*rec):
                self._reap(rec[0])
                time.sleep(0.05)
        self.pidfile.unlink(missing_ok=True)

    def _reap(self, pid: int) -> None:
        if self.proc is not None and self.proc.pid == pid:
            self.proc.poll()

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
