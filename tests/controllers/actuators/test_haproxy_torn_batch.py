"""A ``set weight`` batch torn by a runtime API that dies part-way (timeouts): HAProxy has no
transaction, so the order of the writes and the undo decide what the edge serves afterwards.

Driven through the real :class:`HaproxyAPI` client against a fake runtime socket (it speaks ``get
weight`` / ``set weight`` / ``show stat`` and then goes silent, like a wedged HAProxy), plus a property
over every fail point on the in-memory API shape the suite already uses."""

from __future__ import annotations

import re
import socket
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import given, settings, strategies as st

from opsloop.audit.trail import AuditLog
from opsloop.lb.haproxy import HaproxyAPI, HaproxyError

from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import HaproxyTargetConfig
from opsloop.controllers.actuators.haproxy import HaproxyTarget
from opsloop.controllers.actuators.store import WeightStore
from tests.controllers.actuators.support import ListSink, decision
from tests.controllers.actuators.test_applier import MemoryTarget

BACKEND = "be_web"


class RuntimeSocket:
    """A fake HAProxy admin socket: one command per connection, as HAProxy's non-interactive mode.
    After ``ok_sets`` accepted ``set weight`` commands it reads every command and never answers."""

    def __init__(self, path: Path, weights: dict[str, int], ok_sets: int) -> None:
        self.path = path
        self.weights = dict(weights)
        self.ok_sets = ok_sets
        self.log: list[str] = []
        self.dead = False
        self._stop = threading.Event()
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(str(path))
        self._srv.listen(8)
        self._srv.settimeout(0.1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _reply(self, cmd: str) -> str:
        if m := re.fullmatch(r"get weight (\S+)/(\S+)", cmd):
            w = self.weights[m.group(2)]
            return f"{w} (initial 100)\n"
        if m := re.fullmatch(r"set weight (\S+)/(\S+) (\d+)", cmd):
            self.weights[m.group(2)] = int(m.group(3))
            self.ok_sets -= 1
            if self.ok_sets <= 0:
                self.dead = True  # the write went through; everything after it times out
            return ""
        if cmd == "show stat":
            return "# pxname,svname,status\n" + "".join(f"{BACKEND},{s},UP\n" for s in self.weights) + "\n"
        return "Unknown command.\n"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except socket.timeout:
                continue
            with conn:
                cmd = conn.recv(1024).decode().strip()
                if self.dead:
                    self.log.append(f"{cmd} -> no answer")
                    # held until the client gives up and closes (a fixed wait raced the client's timeout)
                    conn.settimeout(30.0)
                    try:
                        conn.recv(1)
                    except OSError:
                        pass
                    continue
                self.log.append(cmd)
                try:
                    conn.sendall(self._reply(cmd).encode())
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._srv.close()


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[RuntimeSocket]:
    # before: all traffic on "near"; the socket dies after the first accepted write
    sock = RuntimeSocket(tmp_path / "admin.sock", {"near": 256, "far": 0}, ok_sets=1)
    try:
        yield sock
    finally:
        sock.close()


def test_a_socket_dying_after_the_first_write_never_leaves_the_backend_all_zero(runtime: RuntimeSocket,
                                                                               tmp_path: Path) -> None:
    cfg = HaproxyTargetConfig(kind="haproxy", edge="ams1", listener="web", socket=str(runtime.path),
                              backend=BACKEND, servers={"near": "near", "far": "far"}, timeout_s=1.0)
    sink = ListSink()
    act = EdgeActuator(HaproxyTarget(cfg, api=HaproxyAPI(runtime.path, timeout_s=1.0)), "ams1", "web",
                       WeightStore(tmp_path / "store", "ams1", "web"), AuditLog([sink]), max_step=1.0)
    r = act.apply(decision(1, {"near": 0.0, "far": 1.0}))
    assert r.result == "failed"
    # the increase went first: a torn batch leaves both serving, never near 0 / far 0 (503s)
    sets = [c for c in runtime.log if c.startswith("set")]
    assert sets[:2] == [f"set weight {BACKEND}/far 256", f"set weight {BACKEND}/near 0 -> no answer"]
    assert runtime.weights == {"near": 256, "far": 256}
    # the undo of "far" timed out as well: said as failed, not as done, in the result and the audit
    assert "undo FAILED for ['far']" in r.reason and "undone: nothing" in r.reason
    assert sink.records[-1].result == "failed" and "undo FAILED for ['far']" in sink.records[-1].reason
    assert act.store.history() == []


class DyingAPI:
    """The runtime API in memory; every ``set weight`` after the first ``ok_sets`` fails (timeout)."""

    def __init__(self, weights: dict[str, int], ok_sets: int) -> None:
        self.weights = dict(weights)
        self.ok_sets = ok_sets

    def get_weight(self, backend: str, server: str) -> tuple[int, int]:
        return self.weights[server], 100

    def set_weight(self, backend: str, server: str, weight: int) -> None:
        if self.ok_sets <= 0:
            raise HaproxyError("admin socket /run/haproxy.sock: timed out")
        self.ok_sets -= 1
        self.weights[server] = weight

    def show_stat(self) -> str:
        raise HaproxyError("admin socket /run/haproxy.sock: timed out")


SERVERS = ["a", "b", "c", "d"]
weights_st = st.lists(st.integers(0, 256), min_size=4, max_size=4).map(lambda v: dict(zip(SERVERS, v)))


@settings(max_examples=300, deadline=None)
@given(weights_st, weights_st, st.integers(0, 4))
def test_any_torn_batch_keeps_at_least_the_smaller_total(before: dict[str, int], after: dict[str, int],
                                                         ok_sets: int) -> None:
    cfg = HaproxyTargetConfig(kind="haproxy", edge="ams1", listener="web", socket="/nonexistent.sock",
                              backend=BACKEND, servers={s: s for s in SERVERS})
    api = DyingAPI(before, ok_sets)
    try:
        HaproxyTarget(cfg, api=api).write(after)  # type: ignore[arg-type]
        torn = False
    except ActuatorError as e:
        torn = True
        assert "undo FAILED" in str(e) or "nothing written" in str(e)  # the socket stays dead for the undo
    assert torn == (ok_sets < len(SERVERS))
    assert all(api.weights[s] in (before[s], after[s]) for s in SERVERS)
    assert sum(api.weights.values()) >= min(sum(before.values()), sum(after.values()))


def test_a_failed_undo_write_is_named_and_a_working_one_is_not() -> None:
    cfg = HaproxyTargetConfig(kind="haproxy", edge="ams1", listener="web", socket="/nonexistent.sock",
                              backend=BACKEND, servers={"near": "near", "far": "far"})

    class OneFailure(DyingAPI):
        """Only the second write fails: the undo of the first one goes through."""

        def set_weight(self, backend: str, server: str, weight: int) -> None:
            self.ok_sets -= 1
            if self.ok_sets == -1:
                raise HaproxyError("admin socket /run/haproxy.sock: timed out")
            self.weights[server] = weight

    api = OneFailure({"near": 256, "far": 0}, ok_sets=1)
    with pytest.raises(ActuatorError) as e:
        HaproxyTarget(cfg, api=api).write({"near": 0, "far": 256})  # type: ignore[arg-type]
    assert "undone: ['far']" in str(e.value) and "FAILED" not in str(e.value)
    assert api.weights == {"near": 256, "far": 0}  # as it was


def test_write_order_is_increases_then_unchanged_then_decreases() -> None:
    servers = {"a": "a", "b": "b", "c": "c", "d": "d"}
    cfg = HaproxyTargetConfig(kind="haproxy", edge="ams1", listener="web", socket="/nonexistent.sock",
                              backend=BACKEND, servers=servers)
    order: list[str] = []

    class Recording(DyingAPI):
        def set_weight(self, backend: str, server: str, weight: int) -> None:
            order.append(server)
            super().set_weight(backend, server, weight)

    api = Recording({"a": 4, "b": 5, "c": 1, "d": 2}, ok_sets=10)
    HaproxyTarget(cfg, api=api).write({"a": 0, "b": 5, "c": 9, "d": 3})  # type: ignore[arg-type]
    assert order == ["c", "d", "b", "a"]
    assert api.weights == {"a": 0, "b": 5, "c": 9, "d": 3}


class ZeroingTarget(MemoryTarget):
    """An LB whose failed write leaves every server at 0 (a batch torn some other way)."""

    def write(self, weights: dict[str, int]) -> None:
        if weights != {"a": 100, "b": 100, "c": 100} and not self.gone:
            self.weights = {o: 0 for o in self.weights}
            raise ActuatorError("memory target: write torn", "unreachable")
        super().write(weights)


def test_a_failed_write_that_left_nothing_serving_puts_the_weights_read_before_back() -> None:
    target = ZeroingTarget()
    sink = ListSink()
    with tempfile.TemporaryDirectory() as tmp:
        act = EdgeActuator(target, "e", "l", WeightStore(Path(tmp), "e", "l"), AuditLog([sink]), max_step=1.0)
        r = act.apply(decision(1, {"a": 1.0, "b": 0.0, "c": 0.0}, edge="e", listener="l"))
    assert r.result == "failed"
    assert target.weights == {"a": 100, "b": 100, "c": 100}
    assert "previous weights" in r.reason and "re-applied" in r.reason
    assert sink.records[-1].result == "failed" and "re-applied" in sink.records[-1].reason
