"""Seeded schedules against the edge controller service: demand records that are fresh, duplicated,
replayed older than the newest of their key, re-sent for the interval already in the book with other
readings (a corrected record), stamped in the future (within and beyond the clock-skew
bound) or no demand record at all (not JSON, NaN, negative, huge, wrong types, unknown fields), edges
going silent for a while (stale inputs), load balancer checks flapping, operator changes through the
``TopologyStore`` (capacity, health pins, forced pins, latencies; valid and invalid), publishes that
fail (a send refused, a flush timing out after part of the records got through, records nacked, a slow
broker), the controller host's clock stepping back minutes (the collectors' stays right), and crashes at
any point of a tick, after which a new ``ControlLoop`` starts from what ``recover_decisions`` reads back
from the topic (and the API changes from the overrides file), sometimes without one edge's records (an
edge just added, its record lost).

Driven through the real code on a simulated clock: records go through ``DemandConsumer`` (decode, the
book, the dead letter) over a fake ``KafkaConsumer``; decisions through ``DecisionPublisher`` over a fake
``KafkaProducer`` (kafka-python's own futures); recovery through ``recover_decisions`` over a fake
consumer of what the broker actually holds.

After every step: no exception out of a tick and no tick failing on a controller bug; every bad record
counted and dead-lettered, every good one that is the newest of its key in the book; per key, what
reached the topic is stamped in order and never a version twice with other weights, whatever restarts
(a new instance's epoch above every one on the topic); shares sum to 1, none on an origin that is
unhealthy, pinned down or out of reach while another can serve; each move within ``max_step`` of what
the topic last carried (plus the share moved off an unusable origin), after a restart too unless no
edge's record was recovered (an edge whose record was not: within ``max_step`` of its nearest healthy
origin, where a fresh edge starts); a decision repeated only while the book holds the readings the
last one was made on (a corrected record is decided on); inputs that are stale, silent or
stamped ahead of a clock that stepped back give a hold of the weights the topic carries, under the same
version unless a failed publish spent it; what the API serves as published was published; fresh demand
and a clean publish always give a decision (no stall).
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.future import Future
from prometheus_client import REGISTRY

from opsloop.audit.trail import AuditLog
from opsloop.controllers.edge.service import inputs as inputs_module
from opsloop.controllers.edge.service import kafka_io
from opsloop.controllers.edge.service.config import TopologySpec
from opsloop.controllers.edge.service.inputs import DemandBook, DemandConsumer
from opsloop.controllers.edge.service.kafka_io import DecisionPublisher, recover_decisions
from opsloop.controllers.edge.service.loop import ControlLoop
from opsloop.controllers.edge.service.store import TopologyError, TopologyStore
from opsloop.controllers.edge.settings import ControllerSettings
from opsloop.records import EdgeWeights, Mode
from opsloop.topics import Topic
from tests.helpers import ConsumerMsg

T0 = 1_795_400_000.0
LISTENER, BACKEND = "sched", "be_sched"
EDGES = ("e1", "e2")
ORIGINS = ("near", "mid", "far")
LATENCY = {"e1": {"near": 2.0, "mid": 15.0, "far": 60.0}, "e2": {"near": 20.0, "mid": 3.0, "far": 40.0}}
CAPACITY = {"near": 60.0, "mid": 60.0, "far": 500.0}
INTERVAL_S, STALE_S, SKEW_S = 10.0, 30.0, 5.0
WEIGHTS_TOPIC, DEMAND_TOPIC = Topic.EDGE_WEIGHTS.value, Topic.EDGE_DEMAND.value
DEADLETTER_TOPIC = Topic.DEADLETTER.value
EPS = 1e-6


class SimCrash(BaseException):
    """The process dies here (not an ``Exception``: nothing in the service may catch it)."""


def topology() -> TopologySpec:
    return TopologySpec.model_validate({"listeners": [{
        "name": LISTENER, "backend": BACKEND, "edges": [{"name": e} for e in EDGES],
        "origins": [{"name": o, "capacity_rps": CAPACITY[o]} for o in ORIGINS],
        "latency_ms": {e: dict(row) for e, row in LATENCY.items()}}]})


# -- the broker and the fake kafka-python clients --------------------------------------------------------
@dataclass
class Plan:
    """How the next publish goes: ``ok``; ``refuse`` (``send`` raises from the ``at``-th record on: buffer
    full); ``timeout`` (the flush times out after the first ``at`` records got through); ``nack`` (the
    records from the ``at``-th on fail on the broker); ``slow`` (the flush takes ``slow_s`` of the clock,
    then succeeds); ``crash_send`` / ``crash_flush`` (the process dies at the ``at``-th send, or in the
    flush after the first ``at`` records got through)."""
    kind: str = "ok"
    at: int = 0
    slow_s: float = 0.0


@dataclass
class Broker:
    clock: list[float]
    log: dict[str, list[tuple[bytes | None, bytes]]] = field(default_factory=dict)
    plan: Plan = field(default_factory=Plan)
    sends: int = 0
    offered: dict[str, int] = field(default_factory=dict)   # records handed to a producer, per topic
    stamps: set[tuple[str, int, int]] = field(default_factory=set)   # (edge, epoch, version) of weights offered

    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        self.log.setdefault(topic, []).append((key, value))

    def topic(self, name: str) -> list[tuple[bytes | None, bytes]]:
        return self.log.get(name, [])


class FakeProducer:
    """``KafkaProducer`` over :class:`Broker`: records wait for ``flush``, which delivers or fails them
    as the broker's plan says (kafka-python's own futures, so callbacks run as they would)."""

    def __init__(self, broker: Broker, **_: Any) -> None:
        self.broker = broker
        self.pending: list[tuple[str, bytes | None, bytes, Future]] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None) -> Future:
        plan, k = self.broker.plan, self.broker.sends
        self.broker.sends += 1
        self.broker.offered[topic] = self.broker.offered.get(topic, 0) + 1
        if topic == WEIGHTS_TOPIC:
            rec = EdgeWeights.decode(value)
            self.broker.stamps.add((rec.edge, *rec.stamp))
        if plan.kind == "crash_send" and k >= plan.at:
            raise SimCrash(f"crash at send {k}")
        if plan.kind == "refuse" and k >= plan.at:
            raise KafkaTimeoutError("Failed to allocate memory within the configured max blocking time")
        fut = Future()
        self.pending.append((topic, key, value or b"", fut))
        return fut

    def flush(self, timeout: float | None = None) -> None:
        plan = self.broker.plan
        pending, self.pending = self.pending, []
        if plan.kind == "slow":
            self.broker.clock[0] += plan.slow_s
        for n, (topic, key, value, fut) in enumerate(pending):
            if plan.kind in ("timeout", "crash_flush") and n >= plan.at:
                continue   # still in the buffer when the flush gave up (or the process died): never sent
            if plan.kind == "nack" and n >= plan.at:
                fut.failure(KafkaError("NotEnoughReplicasError"))
                continue
            self.broker.append(topic, key, value)
            fut.success(None)
        if plan.kind == "crash_flush":
            raise SimCrash("crash in flush")
        if plan.kind == "timeout" and len(pending) > plan.at:
            raise KafkaTimeoutError(f"Timeout after waiting for {timeout} secs.")

    def close(self, timeout: float | None = None) -> None:
        pass


class FakeTopicConsumer:
    """``KafkaConsumer`` over one topic of :class:`Broker`, one partition: for ``recover_decisions``
    (chunks read back from the end) and for ``DemandConsumer`` (the batch in ``feed``, then the consumer's stop)."""

    def __init__(self, broker: Broker, feed: list[ConsumerMsg] | None = None, stop: Any = None,
                 hidden: frozenset[bytes] = frozenset(), **_: Any) -> None:
        self.broker = broker
        self.feed = feed
        self.stop = stop
        self.hidden = hidden   # keys whose records this consumer never sees (a recovery that misses them)
        self.pos = 0
        self.topic_name = ""

    def partitions_for_topic(self, topic: str) -> set[int]:
        self.topic_name = topic
        return {0}

    def assign(self, tps: list[Any]) -> None:
        self.tps = tps

    def seek_to_beginning(self, *tps: Any) -> None:
        self.pos = 0

    def seek_to_end(self, *tps: Any) -> None:
        self.pos = len(self.broker.topic(self.topic_name))

    def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: len(self.broker.topic(self.topic_name)) for tp in tps}

    def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: 0 for tp in tps}

    def seek(self, tp: Any, offset: int) -> None:
        self.pos = offset

    def position(self, tp: Any, timeout_ms: int | None = None) -> int:
        return self.pos

    def poll(self, timeout_ms: int = 0) -> dict[Any, list[ConsumerMsg]]:
        if self.feed is not None:   # the demand consumer: one batch, then stopped
            batch, self.feed = self.feed, []
            if not batch:
                self.stop.set()
            return {self.tps[0]: batch} if batch else {}
        records = self.broker.topic(self.topic_name)[self.pos:]
        out = [ConsumerMsg(self.topic_name, 0, self.pos + i, k, v) for i, (k, v) in enumerate(records)
               if k is None or k not in self.hidden]
        self.pos += len(records)
        return {self.tps[0]: out} if out else {}

    def close(self) -> None:
        pass


# -- demand records ------------------------------------------------------------------------------------
BAD_DEMAND = (
    b"", b"not json", b"[1, 2]", b'{"edge": "e1", "backend": "be_sched", "demand_rps": NaN, "timestamp": 1}',
)


def bad_fields(rng: random.Random, edge: str, now: float) -> dict[str, Any]:
    """A JSON record the schema must refuse (NaN is no JSON: those are in :data:`BAD_DEMAND`)."""
    doc: dict[str, Any] = {"edge": edge, "backend": BACKEND, "demand_rps": 10.0, "timestamp": now,
                           "origins": {"near": {"rps": 5.0}}}
    key, value = rng.choice([("demand_rps", -5.0), ("demand_rps", 1e300), ("demand_rps", "lots"),
                             ("demand_rps", None), ("timestamp", -1.0), ("timestamp", "now"), ("timestamp", 0),
                             ("edge", ""), ("backend", 7), ("origins", [1, 2]), ("origins", {"near": {"rps": -1}}),
                             ("origins", {"near": {"rps": 1.0, "rtime_ms": -3}}), ("schema_version", 9),
                             ("surprise", 1), ("demand_rps", 2e12)])
    doc[key] = value
    return doc


@dataclass
class World:
    rng: random.Random
    clock: list[float]
    lb_up: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(ORIGINS, True))
    silent: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EDGES, 0))
    level: dict[str, float] = field(default_factory=dict)
    sent_good: list[bytes] = field(default_factory=list)

    def good(self, edge: str, share: dict[str, float], ts: float) -> bytes:
        rps = max(0.0, self.level[edge] * (1 + 0.1 * self.rng.gauss(0, 1)))
        if self.rng.random() < 0.02:
            rps = self.rng.choice([0.0, 1e9, 1e12])   # valid on the wire, whatever the origins can take
        origins = {o: {"rps": rps * share.get(o, 0.0), "up": self.lb_up[o],
                       "rtime_ms": self.rng.choice([None, 0.0, LATENCY[edge][o] + self.rng.uniform(0, 20), 1e9])}
                   for o in ORIGINS}
        return orjson.dumps({"edge": edge, "backend": BACKEND, "demand_rps": rps, "origins": origins,
                             "timestamp": ts})


def expected_book(before: dict[str, float | None], batch: list[tuple[str, bytes, str]],
                  now: float) -> tuple[dict[str, float | None], int]:
    """The newest accepted timestamp per edge after ``batch`` ((edge, raw, kind) in order), and how many
    valid records were from beyond the clock skew ahead of the controller's clock ``now``."""
    out, future = dict(before), 0
    for edge, raw, kind in batch:
        if kind == "bad":
            continue
        ts = orjson.loads(raw)["timestamp"]
        if ts > now + SKEW_S:
            future += 1
        elif out[edge] is None or ts >= out[edge]:
            out[edge] = ts
    return out, future


def age_of(svc: Service, edge: str, now: float) -> float:
    """How old the loop must take ``edge``'s demand at ``now``: from the start when never heard from,
    stale when stamped beyond the clock skew ahead (the controller's clock stepped back)."""
    rec = svc.book.get(BACKEND, edge)
    if rec is None:
        return now - svc.loop.started_at
    return math.inf if rec.timestamp - now > SKEW_S else now - rec.timestamp


# -- the service under test, and its restarts ----------------------------------------------------------
@dataclass
class Service:
    store: TopologyStore
    book: DemandBook
    publisher: DecisionPublisher
    consumer: DemandConsumer
    loop: ControlLoop
    # edges whose next decision is not bounded: none recovered, the first decision is the initial assignment
    unbounded: set[str]
    # edges started fresh beside recovered ones: their first decision is bounded from this start, not the topic
    started: dict[str, EdgeWeights]


def fresh_start(store: TopologyStore) -> dict[str, dict[str, float]]:
    """Where an edge with no weights starts: all on its nearest origin healthy by the topology file and the
    API's pins (the load balancers' checks not known yet), else its nearest reachable one."""
    snap = store.snapshot(LISTENER)
    healthy = {o.name for o in snap.spec.origins
               if snap.health_override.get(o.name, o.healthy)}
    out = {}
    for e in EDGES:
        row = {o: ms for o, ms in snap.spec.latency_ms.get(e, {}).items() if ms is not None}
        pool = {o: ms for o, ms in row.items() if o in healthy} or row
        nearest = min(pool, key=lambda o: (pool[o], ORIGINS.index(o)))
        out[e] = {o: 1.0 if o == nearest else 0.0 for o in ORIGINS}
    return out


def start(broker: Broker, clock: list[float], settings: ControllerSettings, overrides: Path,
          monkeypatch: pytest.MonkeyPatch, hide: str | None = None) -> Service:
    """A new instance; ``hide``: an edge whose records its recovery does not see."""
    hidden = frozenset() if hide is None else frozenset({f"{LISTENER}|{hide}".encode()})
    monkeypatch.setattr(kafka_io, "service_producer", lambda kafka, client_id, **kw: FakeProducer(broker, **kw))
    monkeypatch.setattr(kafka_io, "KafkaConsumer", lambda **kw: FakeTopicConsumer(broker, hidden=hidden, **kw))
    store = TopologyStore(topology(), AuditLog(), overrides)
    book = DemandBook(max_clock_skew_s=SKEW_S, clock=lambda: clock[0])
    publisher = DecisionPublisher("127.0.0.1:9", flush_timeout_s=1.0)
    consumer = DemandConsumer("127.0.0.1:9", book, topic=DEMAND_TOPIC, deadletter=publisher.deadletter)
    recovered = recover_decisions("127.0.0.1:9", topic=WEIGHTS_TOPIC, timeout_s=5.0)
    assert hide is None or (LISTENER, hide) not in recovered
    loop = ControlLoop(store, book, settings, publisher, recovered, clock=lambda: clock[0])
    missing = {e for e in EDGES if (LISTENER, e) not in recovered}
    if missing == set(EDGES):
        return Service(store, book, publisher, consumer, loop, set(EDGES), {})
    starts = fresh_start(store)
    started = {e: EdgeWeights(version=0, listener=LISTENER, edge=e, weights=starts[e], computed_at=clock[0])
               for e in missing}
    return Service(store, book, publisher, consumer, loop, set(), started)


def ingest(svc: Service, broker: Broker, raws: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """``raws`` through the real ``DemandConsumer._consume`` (decode, the book, the dead letter)."""
    base = len(broker.topic(DEMAND_TOPIC))
    feed = [ConsumerMsg(DEMAND_TOPIC, 0, base + i, b"k", raw) for i, raw in enumerate(raws)]
    for raw in raws:
        broker.append(DEMAND_TOPIC, b"k", raw)
    stop = svc.consumer._stop
    stop.clear()
    monkeypatch.setattr(inputs_module, "KafkaConsumer",
                        lambda **kw: FakeTopicConsumer(broker, feed=feed, stop=stop, **kw))
    svc.consumer._consume()
    stop.clear()


def reading(rec: Any) -> tuple[Any, ...] | None:
    """What the controller reads of a demand record (its status texts not): equal, one measurement."""
    if rec is None:
        return None
    return rec.timestamp, rec.demand_rps, sorted((o, s.rps, s.up, s.rtime_ms) for o, s in rec.origins.items())


def ticks_errored() -> float:
    return REGISTRY.get_sample_value("opsloop_edge_ticks_total", {"listener": LISTENER, "outcome": "error"}) or 0.0


# -- operator changes --------------------------------------------------------------------------------------
INVALID_CAPACITY = (float("nan"), -1.0, float("inf"), 1e30, "abc", None, True)
INVALID_LATENCY = (float("nan"), -5.0, 1e9, "x", True)


def operator(rng: random.Random, store: TopologyStore) -> str:
    """One API change, valid or not; an invalid one must leave the topology as it was."""
    before = store.topology()
    o, e = rng.choice(ORIGINS), rng.choice(EDGES)
    op = rng.choice(["capacity", "health", "health", "latency"])
    bad = rng.random() < 0.3
    try:
        if op == "capacity":
            value: Any = rng.choice(INVALID_CAPACITY) if bad else rng.choice([0.0, 5.0, 40.0, 120.0, 400.0])
            store.set_capacity(LISTENER, o, value)
        elif op == "health":
            if bad:
                healthy, force = rng.choice([("yes", False), (1, False), (None, True), (False, True), (True, "y")])
            else:
                healthy, force = rng.choice([(None, False), (None, False), (False, False), (True, False),
                                             (True, True)])
            store.set_health(LISTENER, o, healthy, force=force)
        else:
            ms: Any = rng.choice(INVALID_LATENCY) if bad else rng.choice([math.inf, 1.0, 25.0, 90.0, LATENCY[e][o]])
            store.set_latency(LISTENER, e, o, ms)
    except TopologyError:
        assert bad, f"a valid {op} change refused"
        assert store.topology() == before, "an invalid change left something behind"
        return f"{op} refused"
    assert not bad, f"an invalid {op} change accepted"
    return op


# -- invariants --------------------------------------------------------------------------------------------
def usable_now(svc: Service, now: float) -> dict[str, set[str]]:
    """Per edge, the origins that may carry traffic at a tick at ``now``: healthy (the file, the API's
    pins, and no fresh record seeing it DOWN unless forced up; with stale inputs no record at all) and
    a path to it."""
    snap = svc.store.snapshot(LISTENER)
    stale = any(age_of(svc, e, now) > STALE_S for e in EDGES)
    down = set()
    for e in EDGES:
        rec = svc.book.get(BACKEND, e)
        if rec is not None and (stale or age_of(svc, e, now) <= STALE_S):   # stale: the last DOWN seen too
            down |= {o for o, st in rec.origins.items() if not st.up}
    healthy = set()
    for o in snap.spec.origins:
        pin = snap.health_override.get(o.name)
        if (pin is None and o.healthy and o.name not in down) or \
                (pin is True and (o.name not in down or o.name in snap.health_forced)):
            healthy.add(o.name)
    return {e: {o for o in healthy if snap.spec.latency_ms.get(e, {}).get(o) is not None} for e in EDGES}


def reachable_now(svc: Service) -> dict[str, set[str]]:
    spec = svc.store.snapshot(LISTENER).spec
    return {e: {o for o in ORIGINS if spec.latency_ms.get(e, {}).get(o) is not None} for e in EDGES}


def check_record(rec: EdgeWeights, prev: EdgeWeights | None, usable: set[str], reachable: set[str],
                 max_step: float, bounded: bool, ctx: str) -> None:
    w = rec.weights
    assert set(w) == set(ORIGINS) and abs(math.fsum(w.values()) - 1.0) <= EPS and max(w.values()) > 0, ctx
    # nothing on an origin that cannot serve while one can (an edge with none: held, not all-zero)
    allowed = usable if usable else reachable
    if allowed:
        assert all(w[o] <= EPS for o in ORIGINS if o not in allowed), \
            f"{ctx}: on unusable origin {w} ({usable}) [{rec.mode.value}: {rec.reason[:300]}]"
    if prev is None:
        return
    moved = sum(prev.weights.get(o, 0.0) for o in ORIGINS if o not in allowed) if allowed else 0.0
    stale = rec.mode is Mode.HOLD and rec.reason.startswith("stale inputs")
    if stale:
        # fail static: the weights the topic carries, only the share of an origin that cannot serve moved
        for o in ORIGINS:
            if o in allowed:
                assert w[o] >= prev.weights.get(o, 0.0) - EPS, f"{ctx}: stale inputs moved {prev.weights} -> {w}"
        if moved <= EPS:
            assert all(abs(w[o] - prev.weights.get(o, 0.0)) <= EPS for o in ORIGINS), \
                f"{ctx}: stale inputs published new weights {prev.weights} -> {w}"
    if bounded and rec.mode is not Mode.FALLBACK:
        for o in ORIGINS:
            d = abs(w[o] - prev.weights.get(o, 0.0))
            assert d <= max_step + moved + EPS, f"{ctx}: {o} moved {d:.3f} > {max_step} (+{moved:.3f}) " \
                                                f"{prev.weights} -> {w} [{rec.mode.value}: {rec.reason[:200]}]"


# -- the schedule -----------------------------------------------------------------------------------------
FAULTS = ("refuse", "timeout", "nack", "slow", "crash_send", "crash_flush")


def run_schedule(seed: int, tmp: Path, monkeypatch: pytest.MonkeyPatch, steps: int = 80) -> None:
    rng = random.Random(seed)
    clock = [T0 + rng.uniform(0, 1000)]   # the controller host's clock
    true = clock[0]                       # the collectors' (right) clock
    broker = Broker(clock)
    max_step = rng.choice([0.25, 0.5])
    # the whole law on every sixth seed; the others without the clients' rebound and the latency budget,
    # whose extra LP solves (up to 7 a tick) would make the schedules too slow for the suite
    law = {} if seed % 6 == 0 else {"elasticity": 0.0, "noise_latency_budget": 0.0}
    steps = steps if seed % 6 else steps // 2
    settings = ControllerSettings(interval_s=INTERVAL_S, stale_after_s=STALE_S, max_step=max_step,
                                  relax_step=min(0.2, max_step), **law)
    overrides = tmp / f"overrides-{seed}.json"
    svc = start(broker, clock, settings, overrides, monkeypatch)
    world = World(rng, clock, level={e: rng.uniform(10, 90) for e in EDGES})
    seen: dict[tuple[str, int, int], dict[str, float]] = {}      # (edge, epoch, version) -> weights
    last: dict[str, EdgeWeights] = {}                               # per edge: the last record on the topic
    decided_on: dict[str, Any] = {}                                 # per edge: the readings last stepped on
    for step in range(steps):
        ctx = f"seed {seed} step {step}"
        dt = INTERVAL_S + rng.uniform(-0.2, 0.2)
        if rng.random() < 0.04:
            dt += rng.uniform(1, 4) * INTERVAL_S                 # a stall
        clock[0], true = clock[0] + dt, true + dt
        if rng.random() < 0.02:
            clock[0] -= rng.uniform(60, 300)                     # the controller's clock steps back
            ctx += " clock stepped back"
        elif clock[0] < true and rng.random() < 0.1:
            clock[0] = true                                      # ... and is put right
        now = clock[0]
        # the world: checks flap, demand moves, edges fall silent, an operator acts
        if rng.random() < 0.1:
            o = rng.choice(ORIGINS)
            world.lb_up[o] = not world.lb_up[o]
        for e in EDGES:
            world.level[e] = min(400.0, max(0.0, world.level[e] * rng.uniform(0.8, 1.25)))
            world.silent[e] = max(0, world.silent[e] - 1)
        if rng.random() < 0.06:
            for e in rng.sample(EDGES, rng.randint(1, len(EDGES))):
                world.silent[e] = rng.randint(2, 6)
        if rng.random() < 0.15:
            ctx += f" api {operator(rng, svc.store)}"
        # this interval's records, bad and odd ones mixed in
        batch: list[tuple[str, bytes, str]] = []
        for e in EDGES:
            share = last[e].weights if e in last else {"near": 1.0}
            held_rec = svc.book.get(BACKEND, e)
            corrected = held_rec is not None and rng.random() < 0.08
            if corrected:   # the interval in the book again, other readings (a round split over two batches)
                batch.append((e, world.good(e, share, held_rec.timestamp), "corrected"))
            if not world.silent[e] and not (corrected and rng.random() < 0.5):
                batch.append((e, world.good(e, share, true - rng.uniform(0, 2)), "good"))
                world.sent_good.append(batch[-1][1])
            roll = rng.random()
            if roll < 0.08 and world.sent_good:
                batch.append((e, rng.choice(world.sent_good), "dup"))
            elif roll < 0.16:
                batch.append((e, world.good(e, share, true - rng.uniform(3, 3 * STALE_S)), "old"))
            elif roll < 0.22:
                batch.append((e, world.good(e, share, true + SKEW_S + rng.uniform(1, 1e6)), "future_far"))
            elif roll < 0.25:
                batch.append((e, world.good(e, share, true + rng.uniform(0, SKEW_S * 0.9)), "future_near"))
            elif roll < 0.40:
                raw = rng.choice(BAD_DEMAND) if rng.random() < 0.3 else orjson.dumps(bad_fields(rng, e, true))
                batch.append((e, raw, "bad"))
        rng.shuffle(batch)
        # a dup of a record of the other edge is that edge's record
        batch = [(orjson.loads(raw)["edge"] if kind == "dup" else e, raw, kind) for e, raw, kind in batch]
        held = {e: svc.book.get(BACKEND, e) for e in EDGES}
        before = {e: (None if r is None else r.timestamp) for e, r in held.items()}
        rejected, dead = svc.book.rejected, broker.offered.get(DEADLETTER_TOPIC, 0)
        ingest(svc, broker, [raw for _, raw, _ in batch], monkeypatch)
        n_bad = sum(kind == "bad" for _, _, kind in batch)
        want, n_future = expected_book(before, batch, now)
        assert svc.book.rejected - rejected == n_bad + n_future, f"{ctx}: refusals not counted"
        assert broker.offered.get(DEADLETTER_TOPIC, 0) - dead == n_bad, f"{ctx}: bad records not dead-lettered"
        for e in EDGES:
            got = svc.book.get(BACKEND, e)
            assert (None if got is None else got.timestamp) == want[e], f"{ctx}: book {e} lost its newest record"
        # the tick, with a fault in its publish
        kind = rng.choice(FAULTS) if rng.random() < 0.25 else "ok"
        broker.plan, broker.sends = Plan(kind, rng.randrange(0, 2 * len(EDGES) + 2), rng.uniform(1, 8)), 0
        ctx += f" publish {kind}@{broker.plan.at}"
        mark = {t: len(v) for t, v in broker.log.items()}
        errors = ticks_errored()
        usable, reachable = usable_now(svc, now), reachable_now(svc)
        crashed, before_tick = False, clock[0]
        try:
            out = svc.loop.tick()
        except SimCrash:
            crashed = True
        finally:
            broker.plan = Plan()
            true += clock[0] - before_tick   # a slow broker's seconds pass for the collectors too
        assert ticks_errored() == errors, f"{ctx}: a tick failed (see the tick_failed log)"
        # what reached the topic in this tick
        new = [EdgeWeights.decode(v) for _, v in broker.topic(WEIGHTS_TOPIC)[mark.get(WEIGHTS_TOPIC, 0):]]
        held_still, versions = True, []
        blind = any(age_of(svc, e, now) > STALE_S for e in EDGES)
        for rec in new:
            if blind:   # stale, silent or stamped ahead of a clock that stepped back: no decision on them
                assert rec.mode in (Mode.HOLD, Mode.FALLBACK) and rec.reason.startswith("stale inputs"), \
                    f"{ctx}: {rec.edge} decided on stale inputs [{rec.mode.value}: {rec.reason[:200]}]"
            assert rec.listener == LISTENER and rec.epoch == svc.loop.epoch, ctx
            key = (rec.edge, rec.epoch, rec.version)
            if key in seen:
                assert all(abs(seen[key][o] - rec.weights[o]) <= 1e-9 for o in ORIGINS), \
                    f"{ctx}: version {key} reused with other weights {seen[key]} -> {rec.weights}"
            seen[key] = rec.weights
            prev = last.get(rec.edge)
            if prev is not None:
                assert rec.stamp >= prev.stamp, f"{ctx}: {rec.edge} went back {prev.stamp} -> {rec.stamp}"
            # an edge started fresh beside recovered ones moves from where it started, not from the topic
            note = " (started fresh, not recovered)" if rec.edge in svc.started else ""
            check_record(rec, svc.started.pop(rec.edge, prev), usable[rec.edge], reachable[rec.edge], max_step,
                         bounded=rec.edge not in svc.unbounded, ctx=f"{ctx} {rec.edge}{note}")
            held_still = held_still and prev is not None and prev.epoch == rec.epoch and \
                rec.mode is Mode.HOLD and rec.reason.startswith("stale inputs") and \
                all(abs(rec.weights[o] - prev.weights[o]) <= EPS for o in ORIGINS)
            versions.append((prev.version if prev is not None else None, rec.version))
            last[rec.edge] = rec
        # stale inputs and no edge's weights moved: the version stays, unless a failed publish spent it
        # (its records may still arrive: the next one is taken)
        if held_still and len(new) == len(EDGES):
            got = {(r.edge, *r.stamp) for r in (EdgeWeights.decode(v) for _, v in broker.topic(WEIGHTS_TOPIC))}
            spent = {v for _, e, v in broker.stamps - got if e == svc.loop.epoch}   # some edge's never arrived
            assert all(a == b or (b - 1 in spent and a < b) for a, b in versions), \
                f"{ctx}: a new version on stale inputs {versions} (spent {sorted(spent)}) " \
                f"{[(r.edge, r.weights, r.reason[:120]) for r in new]}"
        if new and len({r.edge for r in new}) == len(EDGES):
            svc.unbounded.clear()
        # a decision repeated only on the readings the last step was made on: never the stored record
        # beside a decision made on another (a corrected record of the same interval is decided on)
        if not crashed and out[LISTENER] is not None:
            now_reading = {e: reading(svc.book.get(BACKEND, e)) for e in EDGES}
            if svc.loop.status()[LISTENER]["repeated"]:
                assert now_reading == decided_on, f"{ctx}: repeated a decision made on other readings"
            else:
                decided_on = now_reading
        # what the API serves as published was published
        for doc in svc.loop.weights(LISTENER):
            rec = EdgeWeights.model_validate(doc)
            assert (rec.edge, rec.epoch, rec.version) in seen and all(
                abs(seen[(rec.edge, rec.epoch, rec.version)][o] - rec.weights[o]) <= 1e-9 for o in ORIGINS), \
                f"{ctx}: the API serves {rec.edge} v{rec.version} as published; the topic never got it"
        # no stall: fresh demand from every edge and a clean publish give a decision for every edge
        if not crashed and kind in ("ok", "slow"):
            fresh = all(svc.book.get(BACKEND, e) is not None and age_of(svc, e, now) <= STALE_S for e in EDGES)
            if fresh:
                assert out[LISTENER] is not None and {r.edge for r in new} == set(EDGES), f"{ctx}: no decision"
        if crashed or rng.random() < 0.02:   # a restart: what the topic holds is all that is left
            old_topology = svc.store.topology()
            hide = rng.choice(EDGES) if rng.random() < 0.3 else None   # ... less an edge's records
            if hide is not None:
                ctx += f" recovered without {hide}"
            svc = start(broker, clock, settings, overrides, monkeypatch, hide)
            assert svc.store.topology() == old_topology, f"{ctx}: API changes lost in the restart"
            on_topic = {r.epoch for r in (EdgeWeights.decode(v) for _, v in broker.topic(WEIGHTS_TOPIC))}
            assert svc.loop.epoch > max(on_topic, default=-1), f"{ctx}: a restart reused epoch {svc.loop.epoch}"
            if rng.random() < 0.3:
                clock[0] -= rng.uniform(0, 5)   # the new host's clock a little behind
                ctx += " restarted behind"


# deterministic by default; OPSLOOP_SCHEDULE_SEED=N explores another block of seeds (the failure names it)
SEED_BASE = int(os.environ.get("OPSLOOP_SCHEDULE_SEED", "0"))


@pytest.mark.parametrize("seed", range(SEED_BASE, SEED_BASE + 30))
def test_schedule(seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_schedule(seed, tmp_path, monkeypatch)
