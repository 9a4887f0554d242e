"""Safety properties of EdgeActuator over random decision sequences (in-memory target), and the
service's fail-static / retry logic driven by hand (no Kafka: the consumer is not needed for ``tick``)."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import orjson
from hypothesis import given, settings, strategies as st

from opsloop.audit.trail import AuditLog
from opsloop.records import Finding

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import ActuatorConfig
from opsloop.controllers.actuators.mapping import to_shares
from opsloop.controllers.actuators.service import ActuatorService
from opsloop.controllers.actuators.store import WeightStore
from tests.controllers.actuators.support import ListSink, decision
from tests.helpers import unique

ORIGINS = ["a", "b", "c"]


class MemoryTarget:
    """An LB in memory: records writes, can be DOWN per origin or unreachable."""

    kind = "haproxy"
    max_weight = 256

    def __init__(self) -> None:
        self.weights = {o: 100 for o in ORIGINS}
        self.writes: list[dict[str, int]] = []
        self.down_set: set[str] = set()
        self.gone = False

    @property
    def origins(self) -> list[str]:
        return list(ORIGINS)

    def describe(self) -> str:
        return "memory:test"

    def read(self) -> dict[str, int]:
        if self.gone:
            raise ActuatorError("memory target gone", "unreachable")
        return dict(self.weights)

    def write(self, weights: dict[str, int]) -> None:
        if self.gone:
            raise ActuatorError("memory target gone", "unreachable")
        self.writes.append(dict(weights))
        self.weights = dict(weights)

    def down(self) -> set[str]:
        return set(self.down_set)

    def left_alone(self) -> dict[str, str]:
        return {}


shares_st = st.lists(st.one_of(st.just(0.0), st.floats(0.01, 1.0)), min_size=3, max_size=3).filter(
    lambda v: sum(v) > 0).map(lambda v: {o: x / math.fsum(v) for o, x in zip(ORIGINS, v)})
step_st = st.tuples(st.integers(0, 6), shares_st, st.sets(st.sampled_from(ORIGINS)), st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.lists(step_st, min_size=1, max_size=12), st.floats(0.05, 1.0))
def test_safety_holds_for_any_decision_sequence(steps, max_step: float) -> None:
    target = MemoryTarget()
    with tempfile.TemporaryDirectory() as tmp:
        sink = ListSink()
        act = EdgeActuator(target, "e", "l", WeightStore(Path(tmp), "e", "l"), AuditLog([sink]), max_step=max_step)
        high = None
        noop_audited = None
        for version, shares, down, stale in steps:
            target.down_set = down
            before = dict(target.weights)
            n_writes = len(target.writes)
            n_audit = len(sink.records)
            r = act.apply(decision(version, shares, edge="e", listener="l", age_s=1000 if stale else 0))
            if r.result == "noop" and noop_audited == version:
                assert len(sink.records) == n_audit  # a re-sent version: audited once, then only counted
            else:
                assert len(sink.records) == n_audit + 1 and sink.records[-1].result == r.result  # audited
            if r.result == "noop":
                noop_audited = version
            if high is not None and version < high:
                assert r.result == "stale_version"   # stale or not: a newer version is applied
            elif stale:
                assert r.result == "held"
            if r.result != "applied":
                assert target.weights == before and len(target.writes) == n_writes
                continue
            high = max(high or 0, version)
            after = target.weights
            assert sum(after.values()) > 0  # never all-zero
            assert sum(w for o, w in after.items() if o not in down) > 0  # ... counting only servers not DOWN
            prev, now = to_shares(before), to_shares(after)
            released = {o for o in down if shares[o] == 0}
            freed = sum(prev[o] for o in released)
            for o in ORIGINS:
                if o in released:
                    assert after[o] == 0
                else:  # bounded step (plus released share and one unit of rounding)
                    assert abs(now[o] - prev[o]) <= max_step + freed + 2 / 256 + 1e-9
            # same version again right away: noop when complete, nothing written
            if r.complete:
                n_writes = len(target.writes)
                assert act.apply(decision(version, shares, edge="e", listener="l")).result == "noop"
                assert len(target.writes) == n_writes
                noop_audited = version


def _service(tmp: Path, stale_after_s: float = 10.0) -> tuple[ActuatorService, MemoryTarget, list, ListSink, str]:
    edge = unique("svc")
    cfg = ActuatorConfig(stale_after_s=stale_after_s, store_dir=tmp, backoff_initial_s=1.0, backoff_max_s=4.0,
                         targets=[{"edge": edge, "listener": "l", "kind": "haproxy", "socket": str(tmp / "none.sock"),
                                   "backend": "be", "servers": {o: o for o in ORIGINS}}])
    sent: list = []

    class Producer:
        def send(self, topic, key=None, value=None):
            sent.append((topic, key, value))

    sink = ListSink()
    svc = ActuatorService(cfg, "127.0.0.1:1", [edge], AuditLog([sink]), consumer=object(), producer=Producer())
    target = MemoryTarget()
    svc.slots[("l", edge)].actuator.target = target
    return svc, target, sent, sink, edge


def test_no_decision_for_stale_after_s_is_fail_static(tmp_path: Path) -> None:
    svc, target, sent, sink, edge = _service(tmp_path)
    t0 = time.monotonic()
    svc.tick(t0 + 5)
    assert metrics.FAIL_STATIC.labels("l", edge)._value.get() == 0 and not sent
    svc.tick(t0 + 11)
    assert metrics.FAIL_STATIC.labels("l", edge)._value.get() == 1
    assert sink.results == ["held"] and target.writes == []
    f = Finding.decode(sent[0][2])
    assert sent[0][0] == "findings" and f.detector == "edge.fail_static" and not f.cleared
    svc.tick(t0 + 12)
    assert len(sent) == 1  # one finding while it lasts, not one per tick
    svc.handle_records([(f"l|{edge}".encode(), decision(1, {"a": 0.5, "b": 0.25, "c": 0.25}, edge=edge,
                                                                 listener="l").encode())])
    svc.tick(time.monotonic())
    assert target.weights == {"a": 128, "b": 64, "c": 64}
    assert metrics.FAIL_STATIC.labels("l", edge)._value.get() == 0
    assert Finding.decode(sent[-1][2]).cleared and Finding.decode(sent[-1][2]).id == f.id


def test_unreachable_target_is_retried_with_backoff(tmp_path: Path) -> None:
    svc, target, sent, sink, edge = _service(tmp_path, stale_after_s=1000)
    target.gone = True
    svc.handle_records([(f"l|{edge}".encode(), decision(1, {"a": 0.5, "b": 0.5}, edge=edge, listener="l").encode())])
    t = time.monotonic()
    svc.tick(t)
    slot = svc.slots[("l", edge)]
    assert slot.pending is not None and slot.retry_at == t + 1.0
    svc.tick(t + 0.5)  # not yet due: no second attempt
    assert sink.results == ["failed"]
    svc.tick(t + 1.0)
    assert sink.results == ["failed", "failed"] and slot.retry_at == t + 1.0 + 2.0  # doubled
    assert metrics.ERRORS.labels(edge, "unreachable")._value.get() == 2
    target.gone = False
    svc.tick(t + 3.0)
    assert sink.results[-1] == "applied" and slot.pending is None
    assert target.weights == {"a": 128, "b": 128, "c": 0}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=40)), st.one_of(st.none(), st.binary(max_size=300))),
                max_size=5))
def test_records_fuzz_never_crash(records) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        svc, target, sent, sink, edge = _service(Path(tmp))
        assert svc.handle_records(records) == 0
        assert target.writes == []


def test_a_record_of_ours_that_is_no_decision_is_dead_lettered_and_the_good_one_applied(tmp_path: Path) -> None:
    """A record keyed for our edge that is no decision (not JSON; a weight of -1) is counted and
    kept on the dead-letter topic with the reason, the source topic, partition, offset and key;
    another edge's record is not ours to judge; the good decision in the same poll is applied."""
    svc, target, sent, sink, edge = _service(tmp_path)
    key = f"l|{edge}".encode()
    good = decision(2, {"a": 0.5, "b": 0.5}, edge=edge, listener="l").encode()
    negative = good.replace(b'"a":0.5', b'"a":-1.0')
    assert negative != good
    before = metrics.REJECTED._value.get()
    records = [(key, b"{not json"), (key, negative), (b"l|other-edge", b"junk"), (key, good)]
    assert svc.handle_records(records, [(3, 100 + i) for i in range(len(records))]) == 1
    svc.tick(time.monotonic())
    assert sink.results == ["applied"] and sink.records[0].version == 2
    assert metrics.REJECTED._value.get() - before == 2
    dls = [(k, orjson.loads(v)) for topic, k, v in sent if topic == "telemetry.deadletter"]
    assert [d["value"] for _, d in dls] == ["{not json", negative.decode()]
    assert [(d["partition"], d["offset"]) for _, d in dls] == [(3, 100), (3, 101)]
    assert all(k == key and d["key"] == key.decode() and d["stage"] == "actuator"
               and d["source_topic"] == "edge.weights" and d["reason"] for k, d in dls)


def test_newest_version_of_a_poll_wins(tmp_path: Path) -> None:
    svc, target, sent, sink, edge = _service(tmp_path)
    key = f"l|{edge}".encode()
    recs = [(key, decision(v, {"a": 0.1 * v, "b": 1 - 0.1 * v}, edge=edge, listener="l").encode()) for v in (3, 5, 4)]
    recs.append((b"l|other-edge", decision(9, {"a": 1.0}, edge="other-edge", listener="l").encode()))
    svc.handle_records(recs)
    svc.tick(time.monotonic())
    assert sink.results == ["applied"] and sink.records[0].version == 5


def test_repeated_noop_is_audited_once_per_version(tmp_path: Path) -> None:
    target = MemoryTarget()
    sink = ListSink()
    edge = unique("noop")
    act = EdgeActuator(target, edge, "l", WeightStore(tmp_path, edge, "l"), AuditLog([sink]))
    for _ in range(4):
        act.apply(decision(1, {"a": 0.4, "b": 0.3, "c": 0.3}, edge=edge, listener="l"))
    act.apply(decision(2, {"a": 0.5, "b": 0.25, "c": 0.25}, edge=edge, listener="l"))
    act.apply(decision(2, {"a": 0.5, "b": 0.25, "c": 0.25}, edge=edge, listener="l"))
    assert sink.results == ["applied", "noop", "applied", "noop"]
    assert metrics.APPLIES.labels(edge, "l", "noop")._value.get() == 4
    assert len(target.writes) == 2
