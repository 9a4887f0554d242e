"""What the service schedules (``test_schedule_service.py``) found, one case each:

* a service restarted while a slot failed static forgot the ``edge.fail_static`` finding the previous
  run had opened, so the first fresh decision after the restart cleared nothing and the finding (and its
  page) stayed open for good, with the gauge saying 0;
* a finding whose send raised (or whose future failed) was never sent again: a lost ``cleared`` left the
  page open for good, and a clear not delivered before a restart was forgotten by the next process;
* a read-back ``mismatch`` dropped the decision: nothing retried it, and its offset was committed;
* an internal error (an exception out of the apply) dropped the decision and let the step commit its
  offset: lost though nothing was applied, not even audited; a poison one must end (given up)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka.errors import KafkaTimeoutError
from kafka.future import Future as FakeFuture

from opsloop.audit.trail import AuditLog
from opsloop.records import EdgeWeights, Finding

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators import service as service_mod
from opsloop.controllers.actuators.config import ActuatorConfig, HaproxyTargetConfig
from opsloop.controllers.actuators.haproxy import HaproxyTarget
from opsloop.controllers.actuators.service import ActuatorService
from tests.controllers.actuators.support import ListSink
from tests.controllers.actuators.test_schedule_faults import ORIGINS, FakeRuntime
from tests.controllers.actuators.test_schedule_service import STALE_S, Clock, Producer, Rec
from tests.helpers import unique


def _config(tmp: Path, edge: str) -> ActuatorConfig:
    return ActuatorConfig(stale_after_s=STALE_S, store_dir=tmp / "store", reconcile_interval_s=None, targets=[
        HaproxyTargetConfig(kind="haproxy", edge=edge, listener="web", socket=tmp / "web.sock", backend="be_web",
                            servers={o: o for o in ORIGINS})])


def _run(config: ActuatorConfig, edge: str, lb: FakeRuntime, clock: Clock, producer: Producer) -> ActuatorService:
    """One actuator process over the store and the LB (a restart builds another)."""
    svc = ActuatorService(config, "127.0.0.1:1", [edge], AuditLog([ListSink()]), consumer=object(),
                          producer=producer)
    act = svc.slots[("web", edge)].actuator
    act.target = HaproxyTarget(config.targets[0], api=lb)
    act.clock = clock.time
    return svc


def _findings(producer: Producer) -> list[Finding]:
    return [Finding.decode(v) for topic, v, _ in producer.sent if topic == "findings"]


def test_a_restart_while_failing_static_clears_the_finding_the_previous_run_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(service_mod, "time", clock)
    edge = unique("restart")
    config, lb, producer = _config(tmp_path, edge), FakeRuntime({o: 100 for o in ORIGINS}), Producer()
    gauge = metrics.FAIL_STATIC.labels("web", edge)

    first = _run(config, edge, lb, clock, producer)
    clock.advance(STALE_S + 1)
    first.tick(clock.mono)                              # no decision for stale_after_s: fail static
    [opened] = _findings(producer)
    assert not opened.cleared and gauge._value.get() == 1

    second = _run(config, edge, lb, clock, producer)    # the first process died; a new one starts
    assert gauge._value.get() == 1                      # still holding: nothing fresh came
    clock.advance(1.0)
    decision = EdgeWeights(version=1, listener="web", edge=edge, weights={"a": 0.5, "b": 0.5},
                           computed_at=clock.time(), reason="v1")
    second.handle_records([(f"web|{edge}".encode(), decision.encode())])
    second.tick(clock.mono)
    # the open finding said again (same incident: no new page), then cleared by the fresh decision
    *_, again, cleared = _findings(producer)
    assert not again.cleared and (again.id, again.first_seen) == (opened.id, opened.first_seen)
    assert cleared.cleared and (cleared.id, cleared.first_seen) == (opened.id, opened.first_seen)
    assert gauge._value.get() == 0

    n = len(producer.sent)
    third = _run(config, edge, lb, clock, producer)     # cleared before this restart: nothing carried over
    third.tick(clock.mono)
    assert gauge._value.get() == 0 and len(producer.sent) == n


# -- gaps found by the schedules, one case each ---------------------------------------------------------------
# 1. a finding whose send raised (or whose future failed) was never sent again: a lost ``cleared`` left
#    the page open for good; 2. a read-back ``mismatch`` dropped the decision (nothing retried it); 3. an
#    internal error in a tick dropped the decision and let the step commit its offset (lost, not applied).

KEY_OF = "web|{edge}"


class FlakyProducer(Producer):
    """The broker goes away and comes back: while ``down`` a send raises (kafka-python after
    ``max_block_ms`` without metadata) or, with ``async_fail``, returns a future that fails later
    (metadata cached, the batch expires). Only what the broker took is in ``sent``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.async_fail = False
        self.futures: list[FakeFuture] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes = b"") -> Any:
        if self.down and not self.async_fail:
            raise KafkaTimeoutError("Failed to update metadata after 5.0 secs.")
        fut = FakeFuture()
        if self.down:
            self.futures.append(fut)   # fails at the next ``expire()``
        else:
            super().send(topic, key, value)
            fut.success(None)
        return fut

    def expire(self) -> None:
        for fut in self.futures:
            fut.failure(KafkaTimeoutError("Expiring 1 record(s): 5000 ms has passed since batch creation"))
        self.futures.clear()


class MeddlingRuntime(FakeRuntime):
    """HAProxy with another writer: after each ``set weight`` the servers in ``override`` are put to
    their value again (a hand-made ``set weight`` loop, a second actuator), so the read-back differs."""

    def __init__(self, weights: dict[str, int]) -> None:
        super().__init__(weights)
        self.override: dict[str, int] = {}
        self.buggy = 0   # the next ``buggy`` commands raise an exception no client code expects (a bug)

    def command(self, cmd: str) -> str:
        if self.buggy:
            self.buggy -= 1
            raise ZeroDivisionError("division by zero (a bug in the runtime-API client)")
        reply = super().command(cmd)
        if cmd.startswith("set weight"):
            self.weights.update(self.override)
        return reply


class ListConsumer:
    """Hands out the records once each, from the committed offset; records what was committed."""

    def __init__(self, records: list[tuple[bytes, bytes]]) -> None:
        self.records = records
        self.position = 0
        self.committed = 0

    def poll(self, timeout_ms: int = 0) -> dict[int, list[Rec]]:
        batch = [Rec(k, v, 0, i) for i, (k, v) in enumerate(self.records[self.position:], start=self.position)]
        self.position = len(self.records)
        return {0: batch} if batch else {}

    def assignment(self) -> set[int]:
        return {0}

    def commit(self, timeout_ms: int | None = None) -> None:
        self.committed = self.position

    def close(self) -> None:
        pass


def _decision(edge: str, version: int, clock: Clock, weights: dict[str, float] | None = None) -> EdgeWeights:
    return EdgeWeights(version=version, listener="web", edge=edge, weights=weights or {"a": 0.5, "b": 0.5},
                       computed_at=clock.time(), reason=f"v{version}")


def _records(edge: str, *decisions: EdgeWeights) -> list[tuple[bytes, bytes]]:
    return [(KEY_OF.format(edge=edge).encode(), d.encode()) for d in decisions]


def _service(tmp: Path, monkeypatch: pytest.MonkeyPatch, name: str, producer: Producer | None = None,
             consumer: Any = None, **config: Any) -> tuple[ActuatorService, MeddlingRuntime, Clock, ListSink, str]:
    clock = Clock()
    monkeypatch.setattr(service_mod, "time", clock)
    edge = unique(name)
    cfg = _config(tmp, edge).model_copy(update={"backoff_initial_s": 1.0, "backoff_max_s": 8.0, **config})
    lb, sink = MeddlingRuntime({o: 100 for o in ORIGINS}), ListSink()
    svc = ActuatorService(cfg, "127.0.0.1:1", [edge], AuditLog([sink]), consumer=consumer or object(),
                          producer=producer or Producer())
    act = svc.slots[("web", edge)].actuator
    act.target = HaproxyTarget(cfg.targets[0], api=lb)
    act.clock = clock.time
    return svc, lb, clock, sink, edge


def _until(svc: ActuatorService, clock: Clock, done: Any, limit_s: float = 120.0, dt: float = 0.5) -> None:
    """Tick every ``dt`` (a poll) until ``done()`` or ``limit_s`` passed."""
    end = clock.mono + limit_s
    while not done() and clock.mono < end:
        clock.advance(dt)
        svc.tick(clock.mono)


def _cleared_while_the_broker_is_away(tmp: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[
        ActuatorService, MeddlingRuntime, Clock, ListSink, str, FlakyProducer, Finding]:
    """A slot fails static (its open delivered); then, with the broker away, a fresh decision is applied:
    its clear waits for the broker. The service, its parts, the producer and the delivered open."""
    producer = FlakyProducer()
    svc, lb, clock, sink, edge = _service(tmp, monkeypatch, name, producer)
    clock.advance(STALE_S + 1)
    svc.tick(clock.mono)
    [opened] = _findings(producer)
    producer.down = True
    svc.handle_records(_records(edge, _decision(edge, 1, clock)))
    clock.advance(0.5)
    svc.tick(clock.mono)
    return svc, lb, clock, sink, edge, producer, opened


def test_a_clear_whose_send_failed_reaches_the_broker_once_it_is_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the broker goes away; the slot recovers meanwhile
    svc, lb, clock, sink, edge, producer, opened = _cleared_while_the_broker_is_away(tmp_path, monkeypatch, "lostclear")
    assert sink.results[-1] == "applied" and metrics.FAIL_STATIC.labels("web", edge)._value.get() == 0
    _until(svc, clock, lambda: False, limit_s=10)        # retried meanwhile (counted), never raised
    assert len(_findings(producer)) == 1
    producer.down = False                                # (all within stale_after_s of the fresh decision)
    _until(svc, clock, lambda: len(_findings(producer)) > 1, limit_s=10)
    *_, last = _findings(producer)
    assert last.cleared and (last.id, last.first_seen) == (opened.id, opened.first_seen), _findings(producer)
    n = len(producer.sent)
    _until(svc, clock, lambda: False, limit_s=5)         # delivered once: no more sends
    assert len(producer.sent) == n
    assert metrics.FINDING_SEND_FAILURES.labels(edge, "web")._value.get() >= 2
    assert metrics.FINDINGS_QUEUED.labels(edge, "web")._value.get() == 0
    assert not svc.slots[("web", edge)].actuator.store.fail_static_path.exists()


def test_findings_lost_while_the_broker_was_away_arrive_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opened and cleared both while the broker is away (a send raising, then a future failing later):
    both arrive, in order, once each, when it is back."""
    for async_fail in (False, True):
        producer = FlakyProducer()
        producer.down, producer.async_fail = True, async_fail
        svc, lb, clock, sink, edge = _service(tmp_path / str(async_fail), monkeypatch, "order", producer)
        clock.advance(STALE_S + 1)
        svc.tick(clock.mono)                             # opened: not delivered
        svc.handle_records(_records(edge, _decision(edge, 1, clock)))
        clock.advance(0.5)
        svc.tick(clock.mono)                             # cleared: not delivered
        assert sink.results[-1] == "applied"
        producer.expire()
        _until(svc, clock, lambda: False, limit_s=10)
        producer.expire()
        assert _findings(producer) == []
        producer.down = False
        _until(svc, clock, lambda: len(_findings(producer)) >= 2, limit_s=10)
        _until(svc, clock, lambda: False, limit_s=5)
        states = [(f.cleared, f.first_seen) for f in _findings(producer)]
        assert len(states) == 2 and states[0][1] == states[1][1] and [c for c, _ in states] == [False, True], \
            (async_fail, states)


def test_a_clear_not_yet_delivered_when_the_process_dies_is_sent_by_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # cleared, not delivered; then the process dies
    first, lb, clock, sink, edge, producer, opened = _cleared_while_the_broker_is_away(
        tmp_path, monkeypatch, "clearrestart")
    assert metrics.FAIL_STATIC.labels("web", edge)._value.get() == 0
    producer.down = False
    second = _run(first.config, edge, lb, clock, producer)
    assert metrics.FAIL_STATIC.labels("web", edge)._value.get() == 0   # not failing static: only the clear is owed
    clock.advance(0.5)
    second.tick(clock.mono)
    *_, last = _findings(producer)
    assert last.cleared and (last.id, last.first_seen) == (opened.id, opened.first_seen), _findings(producer)
    assert not second.slots[("web", edge)].actuator.store.fail_static_path.exists()
    n = len(producer.sent)
    third = _run(first.config, edge, lb, clock, producer)               # delivered: nothing owed any more
    third.tick(clock.mono)
    assert len(producer.sent) == n


def test_clears_owed_across_a_restart_come_before_the_newer_incident_and_only_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Incident 1 opened (delivered), then while the broker is away: cleared, and incident 2 opened;
    the process dies. The next one sends the clear of 1, then says 2 is open; the one after that says
    2 is open only: a clear of 1 said again after the open of 2 would resolve 2's page."""
    # incident 1 cleared: not delivered
    first, lb, clock, sink, edge, producer, one = _cleared_while_the_broker_is_away(tmp_path, monkeypatch, "owed")
    clock.advance(STALE_S + 1)
    first.tick(clock.mono)                               # incident 2 opened: not delivered; the process dies
    assert metrics.FAIL_STATIC.labels("web", edge)._value.get() == 1 and len(_findings(producer)) == 1
    producer.down = False
    second = _run(first.config, edge, lb, clock, producer)
    clock.advance(0.5)
    second.tick(clock.mono)
    said = [(f.cleared, f.first_seen) for f in _findings(producer)[1:]]
    assert said[0] == (True, one.first_seen) and said[1][0] is False and said[1][1] > one.first_seen, said
    assert len(said) == 2
    two = said[1][1]
    n = len(producer.sent)
    third = _run(first.config, edge, lb, clock, producer)
    clock.advance(0.5)
    third.tick(clock.mono)
    assert [(f.cleared, f.first_seen) for f in _findings(producer)[n:]] == [(False, two)]


def test_a_mismatch_is_retried_with_backoff_and_then_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = ListConsumer([])
    svc, lb, clock, sink, edge = _service(tmp_path, monkeypatch, "mismatch", consumer=consumer)
    lb.override = {"a": 7}                               # another writer, for one apply
    consumer.records += _records(edge, _decision(edge, 1, clock, {"a": 0.25, "b": 0.75}))
    svc.step()
    assert sink.results == ["mismatch"]
    slot = svc.slots[("web", edge)]
    assert slot.pending is not None and slot.pending.version == 1, "the mismatched decision was dropped"
    assert consumer.committed == 0                       # not done: not committed
    svc.tick(clock.mono)                                 # same instant: no hot retry
    assert sink.results == ["mismatch"]
    lb.override = {}
    clock.advance(1.0)
    svc.step()
    assert sink.results == ["mismatch", "applied"] and lb.weights["a"] == 64 and slot.pending is None
    assert consumer.committed == 1


def test_a_decision_that_keeps_mismatching_is_given_up_after_max_apply_attempts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = ListConsumer([])
    svc, lb, clock, sink, edge = _service(tmp_path, monkeypatch, "mismatch_n", consumer=consumer,
                                          max_apply_attempts=3, stale_after_s=100.0)
    lb.override = {"a": 7}                               # for good
    consumer.records += _records(edge, _decision(edge, 1, clock))
    svc.step()
    times = [clock.mono]
    for _ in range(40):
        clock.advance(0.5)
        n = len(sink.results)
        svc.step()
        if len(sink.results) > n:
            times.append(clock.mono)
    assert sink.results == ["mismatch", "mismatch", "mismatch", "failed"], sink.results
    assert [b - a for a, b in zip(times, times[1:])] == [1.0, 2.0]      # back-off between attempts
    assert "gave up" in sink.records[-1].reason and sink.records[-1].version == 1
    assert metrics.GIVEN_UP.labels(edge, "web", "mismatch")._value.get() == 1
    assert svc.slots[("web", edge)].pending is None
    assert consumer.committed == 1                        # handled (given up): committed
    consumer.records += _records(edge, _decision(edge, 1, clock))       # the controller re-sends it
    clock.advance(10)
    svc.step()
    assert sink.results[-1] == "failed" and len(sink.results) == 4      # given up: not tried again at once
    clock.advance(100)                                    # stale_after_s later (failing static by now) ...
    svc.step()
    assert sink.results[-1] == "held"
    consumer.records += _records(edge, _decision(edge, 1, clock))       # ... a re-send gets a new budget
    svc.step()
    assert sink.results[-1] == "mismatch" and svc.slots[("web", edge)].pending is not None
    lb.override = {}
    consumer.records += _records(edge, _decision(edge, 2, clock, {"a": 0.25, "b": 0.75}))
    clock.advance(1.0)                                    # the next version (a budget of its own), after the back-off
    svc.step()
    assert sink.results[-1] == "applied" and sink.records[-1].version == 2


def test_an_internal_error_keeps_the_decision_pending_and_its_offset_uncommitted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = ListConsumer([])
    svc, lb, clock, sink, edge = _service(tmp_path, monkeypatch, "internal", consumer=consumer)
    lb.buggy = 1
    consumer.records += _records(edge, _decision(edge, 1, clock, {"a": 0.25, "b": 0.75}))
    svc.step()
    slot = svc.slots[("web", edge)]
    assert consumer.committed == 0, "a decision nothing applied was committed"
    assert slot.pending is not None and slot.pending.version == 1
    assert sink.results == ["failed"] and "ZeroDivisionError" in sink.records[-1].reason
    assert metrics.ERRORS.labels(edge, "internal")._value.get() == 1
    svc.tick(clock.mono)                                  # same instant: no hot retry
    assert sink.results == ["failed"]
    clock.advance(1.0)
    svc.step()
    assert sink.results[-1] == "applied" and lb.weights["a"] == 64 and consumer.committed == 1


def test_a_poison_decision_is_given_up_dead_lettered_and_the_next_one_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = ListConsumer([])
    producer = Producer()
    svc, lb, clock, sink, edge = _service(tmp_path, monkeypatch, "poison", producer, consumer,
                                          max_apply_attempts=3, stale_after_s=1000.0)
    lb.buggy = 10 ** 6
    consumer.records += _records(edge, _decision(edge, 1, clock))
    for _ in range(30):
        svc.step()
        clock.advance(0.5)
    assert sink.results.count("failed") == 3 and "gave up" in sink.records[-1].reason, sink.results
    assert metrics.GIVEN_UP.labels(edge, "web", "internal")._value.get() == 1
    assert consumer.committed == 1 and svc.slots[("web", edge)].pending is None
    dead = [orjson.loads(v) for t, v, _ in producer.sent if t == "telemetry.deadletter"]
    assert len(dead) == 1 and dead[0]["offset"] == 0 and "internal" in dead[0]["reason"]
    lb.buggy = 0
    consumer.records += _records(edge, _decision(edge, 2, clock, {"a": 0.25, "b": 0.75}))
    svc.step()
    assert sink.results[-1] == "applied" and sink.records[-1].version == 2 and consumer.committed == 2


# -- an internal error pages only when it outlives its retries (or the slot goes stale) ----------------------
# Before, the first exception out of a slot's tick put the slot in fail static: an edge.fail_static finding
# (a page) opened, and the retry a second later cleared it. A one-off bug paged on-call.

def _fail_static_findings(producer: Producer, edge: str) -> list[Finding]:
    return [f for f in _findings(producer) if f.where.get("edge") == edge]


def test_a_one_off_internal_error_is_audited_and_retried_without_a_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer, producer = ListConsumer([]), Producer()
    svc, lb, clock, sink, edge = _service(tmp_path, monkeypatch, "oneoff", producer, consumer)
    gauge = metrics.FAIL_STATIC.labels("web", edge)
    lb.buggy = 1
    consumer.records += _records(edge, _decision(edge, 1, clock, {"a": 0.25, "b": 0.75}))
    svc.step()
    assert sink.results == ["failed"] and "attempt 1 of" in sink.records[-1].reason   # audited
    assert metrics.ERRORS.labels(edge, "internal")._value.get() == 1                    # counted
    assert gauge._value.get() == 0 and _fail_static_findings(producer, edge) == [], "a one-off bug paged"
    assert not svc.slots[("web", edge)].actuator.store.fail_static_path.exists()
    clock.advance(1.0)
    svc.step()
    assert sink.results[-1] == "applied" and consumer.committed == 1
    assert gauge._value.get() == 0 and _fail_static_findings(producer, edge) == []


def test_a_decision_given_up_after_internal_errors_fails_static_until_one_applies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer, producer = ListConsumer([]), Producer()
    svc, lb, clock, sink, edge = _service(tmp_path, monkeypatch, "givenup", producer, consumer,
                                          max_apply_attempts=3, stale_after_s=1000.0)
    gauge = metrics.FAIL_STATIC.labels("web", edge)
    lb.buggy = 10 ** 6
    consumer.records += _records(edge, _decision(edge, 1, clock))
    while "gave up" not in (sink.records[-1].reason if sink.records else ""):
        assert gauge._value.get() == 0 and _fail_static_findings(producer, edge) == [], sink.results
        svc.step()
        clock.advance(0.5)
    assert sink.results == ["failed"] * 3
    [opened] = _fail_static_findings(producer, edge)           # the bug outlived its retries: a page
    assert not opened.cleared and "gave up" in opened.explanation and "internal" in opened.explanation
    assert gauge._value.get() == 1
    lb.buggy = 0
    consumer.records += _records(edge, _decision(edge, 2, clock, {"a": 0.25, "b": 0.75}))
    svc.step()
    assert sink.results[-1] == "applied" and gauge._value.get() == 0
    *_, cleared = _fail_static_findings(producer, edge)
    assert cleared.cleared and cleared.first_seen == opened.first_seen


def test_a_tick_that_raises_outside_an_apply_fails_static_only_when_stale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in reconcile (no decision to retry; it runs again next interval): audited and counted, no page;
    if every tick raises, the staleness check the tick never reaches still puts the slot in fail static."""
    consumer, producer = ListConsumer([]), Producer()
    svc, lb, clock, sink, edge = _service(tmp_path, monkeypatch, "reconcilebug", producer, consumer,
                                          reconcile_interval_s=0.5)
    gauge = metrics.FAIL_STATIC.labels("web", edge)
    consumer.records += _records(edge, _decision(edge, 1, clock))
    svc.step()
    assert sink.results == ["applied"]
    fresh = clock.mono
    act = svc.slots[("web", edge)].actuator

    def buggy_reconcile() -> None:
        raise ZeroDivisionError("a bug in reconcile")

    act.reconcile = buggy_reconcile  # type: ignore[method-assign]
    errors = metrics.ERRORS.labels(edge, "internal")._value.get()
    while clock.mono - fresh <= STALE_S:
        assert gauge._value.get() == 0 and _fail_static_findings(producer, edge) == [], sink.results[-3:]
        clock.advance(0.5)
        svc.tick(clock.mono)
    assert metrics.ERRORS.labels(edge, "internal")._value.get() - errors >= STALE_S / 0.5 - 1
    failed = [r for r in sink.records if r.result == "failed"]
    assert failed and all(r.action == "edge.weights.reconcile" and "ZeroDivisionError" in r.reason for r in failed)
    assert gauge._value.get() == 1                              # stale: every tick raised before its own check
    [opened] = _fail_static_findings(producer, edge)
    assert not opened.cleared and "no decision applied" in opened.explanation
    assert sink.records[-1].result == "held" and "ZeroDivisionError" in sink.records[-1].reason


# -- a clear owed by a previous run left the list before it was queued -------------------------------------------
# Before, ``owed_clears.pop(0)`` ran before the clear's finding was built and queued: an exception there (a
# bug) lost it, the next write of the state file left it out, and the page of that incident stayed open for good.

def test_an_owed_clear_whose_restating_raised_is_still_owed_and_said_before_the_newer_incident(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # incident 1 cleared, not delivered; the process dies
    first, lb, clock, sink, edge, producer, one = _cleared_while_the_broker_is_away(
        tmp_path, monkeypatch, "owedraise")
    producer.down = False
    second = _run(first.config, edge, lb, clock, producer)
    store = second.slots[("web", edge)].actuator.store
    build = second._new_finding
    broken = [1]

    def new_finding(slot: Any, now: float, reason: str, cleared: bool, first_seen: float | None = None) -> Finding:
        if reason == service_mod.RESTATED_CLEAR and broken:
            broken.pop()
            raise ZeroDivisionError("a bug building the restated clear")
        return build(slot, now, reason, cleared, first_seen)

    monkeypatch.setattr(second, "_new_finding", new_finding)
    producer.down = True                                 # what the restarted run says waits for the broker
    clock.advance(STALE_S + 1)                           # and nothing fresh since its start: incident 2 opens
    second.tick(clock.mono)                              # the restating raises: the tick is broken off
    assert not broken and metrics.FAIL_STATIC.labels("web", edge)._value.get() == 1
    state = store.fail_static_state()
    assert state is not None and not state.cleared and state.since > one.first_seen
    assert state.owed == [one.first_seen], "the clear of incident 1 left the state file before it was delivered"
    producer.down = False
    _until(second, clock, lambda: len(_findings(producer)) >= 3, limit_s=10)
    said = [(f.cleared, f.first_seen) for f in _findings(producer)[1:]]
    assert said == [(True, one.first_seen), (False, state.since)], said   # the old clear first, once
    state = store.fail_static_state()
    assert state is not None and state.owed == [] and (state.since, state.cleared) == (said[1][1], False)
