"""Seeded schedules against the detector handlers' per-key state and findings, without Faust or Kafka.

Every detector handler of the worker (firewall, power, netperf, keystone, anomaly) runs as the agent
runs them: one ``FanOut``, records decoded and dead-lettered by ``decode_and_handle``, on a simulated
clock, once per source partition of a batch (half the schedules with partition 1 lagging minutes behind
partition 0). A schedule mixes good rounds, duplicates (the same record again), out-of-order and stale
rounds, rounds stamped beyond the clock skew, garbage (torn JSON, wrong types, NaN, huge numbers, huge tag
sets), series going silent and coming back, hosts seen once, restarts (the state of every key through
JSON into fresh handlers, as the ``detector-state`` table gives it back) and replays of the batch just
handled (at-least-once delivery after a crash before the commit, from the state before or after it was
written).

Checked after every step: nothing raises out of the batch; every bad record has a dead letter and the
good records beside it are handled; per finding id the published events pair up (no clear or refresh of
a finding not open, no second open), never go back in event time (the paging actuator drops a record
older than the newest of its id) and match what the handlers hold open; every key a handler holds is
one its TTL and cap can drop; a replay publishes nothing new (from the state after the batch) or exactly
what the batch published (from the state before it); a restarted worker publishes what the uninterrupted
one does, from the same state. A failing schedule names its seed and step.
"""

from __future__ import annotations

import os
import random
from typing import Any

import orjson
import pytest

from opsloop.records import Finding, Metric, metric
from opsloop.wire import encode_batch
from opsloop.streams.agents import base as agents_base
from opsloop.streams.agents.base import DetectorHandler
from opsloop.streams.detectors.anomaly.handler import AnomalyHandler
from opsloop.streams.detectors.anomaly.settings import AnomalySettings, SeriesSpec
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.netperf.handler import NetperfHandler
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.detectors.power.settings import PowerSettings
from opsloop.streams.runtime import batch as runtime_batch
from opsloop.streams.runtime.batch import DecodedBatch, FanOut, decode_and_handle
from tests.helpers import ConsumerMsg, SimTime

T0 = 1_795_310_400.0
SKEW = 300.0
# deterministic by default; OPSLOOP_SCHEDULE_SEED=N explores another block of seeds (the failure names it)
SEED_BASE = int(os.environ.get("OPSLOOP_SCHEDULE_SEED", "0"))
SEEDS = range(SEED_BASE, SEED_BASE + 30)
STEPS = 100

POWER_HOSTS = ("st0", "st1", "st2", "st3")
HYPERVISORS = ("hv0", "hv1", "hv2", "hv3")
TARGET_SETS = ("ts0", "ts1")
KEYSTONES = ("ks0", "ks1")
# the sources whose records come from partition 1, which may lag behind partition 0 (another consumer's
# backlog, a broker slower to fetch from): its batches bring older event times than the other's
LAGGING = frozenset({"st2", "st3", "hv2", "hv3", "ts1", "ks1"})


class Clock(SimTime):
    """The wall clock the runtime and the handlers read (decode's skew bound, restore's ages)."""

    def __init__(self) -> None:
        super().__init__(T0)


def new_handlers(ttl_s: float, cap: int) -> list[DetectorHandler]:
    anomaly = AnomalySettings(series=[SeriesSpec(metric="ipmi_power", field="watts")], max_series=50,
                              detector={"warmup_points": 8, "refractory": 5})
    handlers: list[DetectorHandler] = [FirewallHandler(), PowerHandler(), NetperfHandler(), KeystoneHandler(),
                                       AnomalyHandler(anomaly, 300.0)]
    for h in handlers:
        h.bound_state(max_clock_skew_s=SKEW, state_ttl_s=ttl_s, max_state_keys=cap)
    return handlers


def all_keys(h: DetectorHandler) -> set[str]:
    if isinstance(h, FirewallHandler):
        return set(h.detector.latest) | {d["where"]["hypervisor"] for d in h.detector.book.open.values()}
    if isinstance(h, PowerHandler):
        return set(h.detector.sums) | set(h.detector.inventory) | {d["where"]["host"]
                                                                    for d in h.detector.book.open.values()}
    if isinstance(h, NetperfHandler):
        return set(h.detectors)
    if isinstance(h, KeystoneHandler):
        return set(h.hosts)
    if isinstance(h, AnomalyHandler):
        return set(h.series)
    raise AssertionError(type(h))


def snapshot(handlers: list[DetectorHandler]) -> dict[str, dict[str, Any]]:
    """What the table holds: every key's state, through JSON."""
    out: dict[str, dict[str, Any]] = {}
    for h in handlers:
        states = {k: s for k in sorted(all_keys(h)) if (s := h.state_of(k)) is not None}
        out[h.name] = orjson.loads(orjson.dumps(states))
    return out


def restored(snap: dict[str, dict[str, Any]], ttl_s: float, cap: int) -> list[DetectorHandler]:
    handlers = new_handlers(ttl_s, cap)
    # a copy, as Faust deserialises the changelog on each start (restored handlers keep the lists they are given)
    snap = orjson.loads(orjson.dumps(snap))
    for h in handlers:
        h.restore(snap[h.name])
        h.touched()
        h.fed()
        h.drain_outbox()
    return handlers


Event = tuple[str, str, float, float, bool, str]   # (event, id, first_seen, last_seen, cleared, severity)


def event_of(event: str, f: Finding) -> Event:
    return event, f.id, f.first_seen, f.last_seen, f.cleared, f.severity.value


def per_id(events: list[Event]) -> dict[str, list[Event]]:
    """Each finding's events in order (the order among findings follows dict order, restored or not)."""
    out: dict[str, list[Event]] = {}
    for e in events:
        out.setdefault(e[1], []).append(e)
    return out


class World:
    """The handlers of one worker, fed record batches; what they published, per finding id."""

    def __init__(self, clock: Clock, ttl_s: float, cap: int) -> None:
        self.clock = clock
        self.ttl_s, self.cap = ttl_s, cap
        self.handlers = new_handlers(ttl_s, cap)
        self.open: dict[str, Finding] = {}       # id -> the finding as last published, while open
        self.incident: dict[str, tuple[float, float]] = {}   # id -> (first_seen, newest last_seen) published

    def run(self, msgs: list[ConsumerMsg]) -> tuple[DecodedBatch, list[Event]]:
        """One batch as the agent handles it: the handlers called once per source partition, in turn."""
        fan = FanOut("detectors", self.handlers)
        groups: dict[int, list[ConsumerMsg]] = {}
        for m in msgs:
            groups.setdefault(m.partition, []).append(m)
        batch = DecodedBatch()
        for group in groups.values():
            part = decode_and_handle("detectors", group, fan, max_clock_skew_s=SKEW)
            batch.deadletters += part.deadletters
            for topic, (records, samples, newest) in part.per_topic.items():
                acc = batch.per_topic.setdefault(topic, [0, 0, 0.0])
                acc[0], acc[1], acc[2] = acc[0] + records, acc[1] + samples, max(acc[2], newest)
        out: list[Event] = []
        for h in self.handlers:
            for event, f in h.drain_outbox():
                out.append(event_of(event, f))
                self._apply(event, f)
        return batch, out

    def _apply(self, event: str, f: Finding) -> None:
        fid = f.id
        first, newest = self.incident.get(fid, (f.first_seen, f.last_seen))
        # event time never goes back for one id: the paging actuator drops an older record as stale
        if event == "opened":
            assert f.first_seen >= newest, \
                f"{f.detector} {f.where} re-opened at {f.first_seen}, before its last record ({newest})"
        else:
            assert f.last_seen >= newest, \
                f"{event} of {f.detector} {f.where} at {f.last_seen}, before its last record ({newest})"
        self.incident[fid] = (f.first_seen, max(newest, f.last_seen))
        if event == "opened":
            assert fid not in self.open, f"second open of {f.detector} {f.where} (first_seen {f.first_seen})"
            self.open[fid] = f
        else:
            assert fid in self.open, f"{event} of {f.detector} {f.where} that is not open"
            assert f.first_seen == self.open[fid].first_seen, f"{event} of another incident of {f.detector}"
            if event == "cleared":
                assert f.cleared
                del self.open[fid]
            else:
                assert not f.cleared
                self.open[fid] = f

    def held_open(self) -> set[str]:
        return {f.id for h in self.handlers for f in h.open_findings()}

    def restart(self, snap: dict[str, dict[str, Any]]) -> None:
        self.handlers = restored(snap, self.ttl_s, self.cap)


class Source:
    """The telemetry: every source's rounds, good and bad, as records of the topics."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.offset = 0
        self.new = 0   # newcomers so far
        self.silent: dict[str, float] = {}   # source -> event time it speaks again
        self.level = {h: rng.uniform(150, 250) for h in POWER_HOSTS}
        self.lag = rng.choice([0.0, rng.uniform(30.0, 180.0)])   # partition 1's event times behind

    def msg(self, topic: str, value: bytes, key: bytes = b"k", partition: int = 0) -> ConsumerMsg:
        self.offset += 1
        return ConsumerMsg(topic, partition, self.offset, key, value)

    def at(self, name: str, ts: float) -> tuple[float, int]:
        """The event time of ``name``'s round of ``ts``, and the partition its records come from."""
        return (ts - self.lag, 1) if name in LAGGING else (ts, 0)

    def speaks(self, name: str, ts: float) -> bool:
        return self.silent.get(name, 0.0) <= ts

    def power(self, host: str, ts: float) -> Metric:
        watts = self.level[host] * (3.0 if self.rng.random() < 0.15 else self.rng.uniform(0.95, 1.05))
        return metric("ipmi_power", {"watts": round(watts, 1)},
                      {"host": host, "generation": "gen3", "raw_capacity_tb": "96"}, ts)

    def firewall(self, hv: str, ts: float) -> list[Metric]:
        rng = self.rng
        ports = {f"{hv}-p{i}": rng.random() > 0.2 for i in range(rng.randint(0, 3))}
        out = [metric("iptables_vm_port", {"protected": int(ok)}, {"host": hv, "port_id": p, "vm": "vm-" + p}, ts)
               for p, ok in ports.items()]
        if rng.random() < 0.85:   # else a partial round (no host-level sample)
            base = "base-b" if rng.random() < 0.2 else "base-a"
            out.append(metric("iptables_ruleset", {"fingerprint": "fp-" + hv, "base_fingerprint": base},
                              {"host": hv}, ts))
            out.append(metric("iptables_software", {"version": rng.choice(["9.4.1", "9.4.1", "9.0.0"])},
                              {"host": hv, "package": "neutron-common"}, ts))
        return out

    def netperf(self, target_set: str, ts: float) -> list[Metric]:
        rng = self.rng
        out = []
        for q in (1, 8):
            gbps = (3.3 if rng.random() < 0.3 else 3.3 * (q ** 0.4)) * rng.uniform(0.9, 1.1)
            if rng.random() < 0.15:
                gbps *= 0.4   # a drop
            out.append(metric("netperf_throughput", {"mean_gbps": round(gbps, 3)},
                              {"host": "np0", "target_set": target_set, "driver": "netperf", "test": "TCP_STREAM",
                               "queues": str(q)}, ts))
        return out

    def keystone(self, host: str, ts: float) -> list[Metric]:
        rng = self.rng
        slow = rng.random() < 0.3
        return [metric("keystone_probe", {"p50_ms": (600.0 if slow else 8.0) * rng.uniform(0.9, 1.1), "count": 5},
                       {"host": host, "probe": "token"}, ts),
                metric("s3_frontend_requests", {"small_requests": 40, "small_p50_ms": 80.0,
                                                "small_p95_ms": 700.0 if slow else 90.0}, {"host": host}, ts),
                metric("s3_frontend_credential", {"keystone_validations": rng.randint(0, 80)},
                       {"host": host, "access_key": rng.choice(["AK1", "AK2", "AK3"])}, ts)]

    def round(self, ts: float) -> list[ConsumerMsg]:
        """One collection round of every source that speaks: one record per source (a batch of samples)."""
        out = []
        for h in POWER_HOSTS:
            t, p = self.at(h, ts)
            if self.speaks(h, t):
                out.append(self.msg("telemetry.ipmi", encode_batch([self.power(h, t + self.rng.uniform(-2, 2))]),
                                    partition=p))
        for hv in HYPERVISORS:
            t, p = self.at(hv, ts)
            if self.speaks(hv, t) and (samples := self.firewall(hv, t)):
                out.append(self.msg("telemetry.iptables", encode_batch(samples), partition=p))
        for ts_name in TARGET_SETS:
            t, p = self.at(ts_name, ts)
            if self.speaks(ts_name, t) and self.rng.random() < 0.5:
                out.append(self.msg("telemetry.netperf", encode_batch(self.netperf(ts_name, t)), partition=p))
        for k in KEYSTONES:
            t, p = self.at(k, ts)
            if self.speaks(k, t):
                out.append(self.msg("telemetry.keystone", encode_batch(self.keystone(k, t)), partition=p))
        return out

    def garbage(self, ts: float) -> list[tuple[ConsumerMsg, bool]]:
        """Bad records (and whether each carries a good sample too, which must be handled)."""
        rng = self.rng
        host = rng.choice(POWER_HOSTS)
        good = self.power(host, ts).to_dict()
        wrong = [
            (b'{"name": "ipmi_power", "tags": {"host": "st0"}, "fiel', False),          # torn
            (b"\xff\xfe not json", False),
            (b"", False),
            (b'{"name": "ipmi_power", "tags": {"host": "st1"}, "fields": {"watts": NaN}, "timestamp": 1}', False),
            (orjson.dumps({"schema_version": 1, "metrics": [good, {**good, "fields": {"watts": "lots"}}]}), True),
            (orjson.dumps({"schema_version": 1, "metrics": [good, {**good, "fields": {"watts": 1e300}}]}), True),
            (orjson.dumps({"schema_version": 1, "metrics": [good, {**good, "fields": {"watts": 123456.5}}]})
             .replace(b"123456.5", b"1" + b"0" * 30), True),   # beyond 64 bits
            (orjson.dumps({"schema_version": 1, "metrics": [good, {**good, "fields": {"watts": -5}}]}), True),
            (orjson.dumps({"schema_version": 1, "metrics": [good, {**good, "timestamp": ts + SKEW + 3600}]}), True),
            (orjson.dumps({**good, "tags": {f"t{i}": "x" * 3000 for i in range(65)}}), False),   # 65 tags
            (orjson.dumps({"schema_version": 1, "metrics": [
                good, {**good, "fields": {"watts": True}},
                {"name": "keystone_probe", "tags": {"host": "ks9"}, "fields": {"p50_ms": "slow"}, "timestamp": ts},
                {"name": "s3_frontend_credential", "tags": {"host": rng.choice(["ks8", "ks9"])},
                 "fields": {"keystone_validations": 3}, "timestamp": ts},
                {"name": "netperf_throughput", "tags": {"target_set": "ts0", "queues": "many"},
                 "fields": {"mean_gbps": 3.0}, "timestamp": ts}]}), True),
        ]
        value, has_good = rng.choice(wrong)
        topic = "telemetry.ipmi" if b"ipmi" in value[:200] or not value else "telemetry.keystone"
        return [(self.msg(topic, value), has_good)]

    def newcomers(self, ts: float) -> list[ConsumerMsg]:
        self.new += 1
        hv = f"hv-new{self.new}"
        return [self.msg("telemetry.ipmi", encode_batch([metric(
                    "ipmi_power", {"watts": 150.0}, {"host": f"st-new{self.new}", "generation": "gen3",
                                                      "raw_capacity_tb": "96"}, ts)])),
                self.msg("telemetry.iptables", encode_batch([
                    metric("iptables_vm_port", {"protected": 0}, {"host": hv, "port_id": "p", "vm": "v"}, ts),
                    metric("iptables_ruleset", {"base_fingerprint": "base-c"}, {"host": hv}, ts)]))]

    def huge_tags(self, ts: float) -> ConsumerMsg:
        """64 tags of 5000 characters on a watched series: valid, bounded by the handlers."""
        tags = {"host": "st-" + "h" * 5000, "generation": "gen3", "raw_capacity_tb": "96",
                **{f"t{i:02d}": "v" * 5000 for i in range(61)}}
        return self.msg("telemetry.ipmi", encode_batch([metric("ipmi_power", {"watts": 180.0}, tags, ts)]))


def check_batch(world: World, msgs: list[ConsumerMsg], bad: dict[int, bool], batch: DecodedBatch, where: str,
                states: bool = True) -> None:
    letters = {dl.offset for dl in batch.deadletters if dl.offset is not None}
    for off in bad:
        assert off in letters, f"{where}: bad record at offset {off} has no dead letter"
    for m in msgs:
        if m.offset in bad and not bad[m.offset]:
            continue
        assert batch.per_topic[m.topic][1] > 0, f"{where}: no good sample of {m.topic} handled"
    assert set(world.open) == world.held_open(), \
        f"{where}: published open {sorted(world.open)} != held open {sorted(world.held_open())}"
    for h in world.handlers if states else ():
        for k in all_keys(h):
            orjson.dumps(h.state_of(k))   # JSON-able, what the table takes
        if not isinstance(h, AnomalyHandler):   # (it bounds itself by max_series)
            unbounded = all_keys(h) - set(h._seen.keys())   # noqa: SLF001 - the handler's recency of its keys
            assert not unbounded, f"{where}: {h.name} holds keys its TTL and cap never drop: {sorted(unbounded)}"
            assert len(all_keys(h)) <= world.cap, f"{where}: {h.name} holds more keys than its cap"


def run_schedule(seed: int, clock: Clock, ttl_s: float = 86_400.0, cap: int = 1_000, compare: bool = True,
                 late: tuple[float, ...] = (5.0, 600.0, 7200.0)) -> list[str]:
    rng = random.Random(seed)
    src = Source(random.Random(seed * 7919 + 1))
    world = World(clock, ttl_s, cap)
    shadow = World(clock, ttl_s, cap)   # never restarted: a restart must change nothing it publishes (compare)
    trace: list[str] = []
    ts = T0
    last: list[ConsumerMsg] = []
    before_last: dict[str, dict[str, Any]] | None = None
    rolls = [rng.random() for _ in range(STEPS + 1)]   # drawn ahead: a batch before a crash keeps its state
    for step in range(STEPS):
        ts += rng.uniform(20.0, 90.0)
        clock.now = ts + rng.uniform(0.0, 30.0)   # records arrive a little after their event time
        where = f"seed {seed} step {step}"
        roll = rolls[step]
        bad: dict[int, bool] = {}
        if roll < 0.14 and last:
            # at-least-once: the batch again, decoded at its own time (a record refused as stamped too far
            # ahead can be within the skew by a later clock: that difference is the clock's, not the state's)
            clock.now = last_clock
        if roll < 0.08 and last:
            snap = snapshot(world.handlers)
            _, out = world.run(last)
            trace.append(f"replay of {len(last)} records after the state was written")
            # (with keys dropped in between, a comparison over a role or generation they left is made again
            # by the next round of it, the replay's included: only the pairing is checked then)
            assert not compare or out == [], f"{where}: a replay published {out}\n" + "\n".join(trace[-10:])
            assert not compare or snapshot(world.handlers) == snap, \
                f"{where}: a replay changed the state\n" + "\n".join(trace[-10:])
            continue
        if roll < 0.14 and last and before_last is not None:
            # the crash came before the state was written: restored from the state before the batch, then
            # the batch again gives exactly the same findings (event times, not the clock)
            trace.append(f"crash before the state write: restore, replay {len(last)} records")
            world.restart(before_last)
            world.open, world.incident = dict(open_before), dict(incident_before)
            replayed, out = world.run(last)
            # (a restored worker ages its keys from the restore: with a short TTL it drops them later)
            ctx = where + "\n" + "\n".join(trace[-10:])
            assert not compare or per_id(out) == per_id(last_out), \
                f"{ctx}\nthe replay published {out}\nthe batch published {last_out}"
            check_batch(world, last, last_bad, replayed, ctx, states=False)
            assert not compare or snapshot(world.handlers) == snapshot(shadow.handlers), \
                f"{ctx}\nthe replay left another state"
            continue
        if roll < 0.22:
            trace.append("restart from the table")
            world.restart(snapshot(world.handlers))
            assert world.held_open() == set(world.open), f"{where}: a restart changed what is open"
            continue
        msgs = src.round(ts)
        if roll < 0.30 and last:   # the producer's retry: records of the last batch again, among new ones
            good = [m for m in last if m.offset not in last_bad]
            msgs += [src.msg(m.topic, m.value, m.key, m.partition) for m in rng.sample(good, min(len(good), 3))]
            trace.append("duplicates")
        elif roll < 0.36:   # a late round: stamped long ago (out of order), or a little ago
            msgs += src.round(ts - rng.choice(late))
            trace.append("late round")
        elif roll < 0.40:   # a round stamped beyond the skew: every record of it dead-lettered
            future = src.round(ts + SKEW + rng.uniform(60, 86_400))
            msgs += future
            bad.update({m.offset: False for m in future})
            trace.append("future round")
        elif roll < 0.55:
            for m, has_good in src.garbage(ts):
                msgs.append(m)
                bad[m.offset] = has_good
            trace.append("garbage")
        elif roll < 0.58:
            msgs.append(src.huge_tags(ts))
            trace.append("huge tags")
        elif roll < 0.61:   # a host and a hypervisor seen once: dropped by the TTL, or the cap before it
            msgs += src.newcomers(ts)
            trace.append("newcomers")
        elif roll < 0.66:
            name = rng.choice(POWER_HOSTS + HYPERVISORS + TARGET_SETS + KEYSTONES)
            # back long after the TTL, or just when it drops the key (its next round on the way)
            src.silent[name] = ts + rng.choice([300.0, 3000.0, 2 * ttl_s, ttl_s + rng.uniform(0.0, 60.0)])
            trace.append(f"{name} goes silent")
        rng.shuffle(msgs)
        before_last = snapshot(world.handlers) if 0.08 <= rolls[step + 1] < 0.14 else None
        open_before, incident_before = dict(world.open), dict(world.incident)
        batch, out = world.run(msgs)
        _, shadow_out = shadow.run(msgs) if compare else (None, out)
        trace.append(f"batch of {len(msgs)} records ({len(bad)} bad): {len(out)} events")
        ctx = where + "\n" + "\n".join(trace[-10:])
        check_batch(world, msgs, bad, batch, ctx, states=step % 10 == 0)
        assert not compare or per_id(out) == per_id(shadow_out), \
            f"{ctx}\nrestarted published {out}\nuninterrupted {shadow_out}"
        last, last_out, last_clock, last_bad = msgs, out, clock.now, bad
    return trace


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(runtime_batch, "time", c)
    monkeypatch.setattr(agents_base, "time", c)
    return c


@pytest.mark.parametrize("seed", SEEDS)
def test_schedule(seed: int, clock: Clock) -> None:
    run_schedule(seed, clock)


@pytest.mark.parametrize("seed", range(SEED_BASE + 100, SEED_BASE + 110))
def test_schedule_with_tight_bounds(seed: int, clock: Clock) -> None:
    """Keys dropped by the TTL and by the cap in between (a restarted worker ages its keys from the restore,
    so it drops them later than the uninterrupted one: documented, not compared). The cap holds a batch's
    keys, and no round comes late by more than seconds: a key dropped forgets what it saw, so a late round
    of it, or a replay of a batch with more keys than the cap, is news to it (the bound's documented cost)."""
    run_schedule(seed, clock, ttl_s=900.0, cap=6, compare=False, late=(5.0,))


# ------------------------------------------------------------------------------ what the schedules found
def test_a_dropped_keys_findings_clear_at_event_time_so_its_return_reopens_them() -> None:
    """Before: a key dropped by its TTL cleared its findings at the worker's clock (the batch's receive time),
    ahead of every event time of the stream; the host coming back a moment later re-opened them with an
    earlier first_seen, which the paging actuator drops as older than the clear (no page), and a replay of
    the dropping batch cleared them at another time."""
    h = FirewallHandler()
    h.bound_state(max_clock_skew_s=SKEW, state_ttl_s=600, max_state_keys=100)
    port = {"host": "hv-back", "port_id": "p1", "vm": "vm-1"}
    h.handle([metric("iptables_vm_port", {"protected": 0}, port, T0),
              metric("iptables_ruleset", {"base_fingerprint": "a"}, {"host": "hv-back"}, T0)], T0 + 5)
    [(event, opened)] = h.drain_outbox()
    assert event == "opened"
    h.handle([], T0 + 700)   # silent for the TTL: dropped, its finding cleared
    [(event, cleared)] = h.drain_outbox()
    assert event == "cleared" and cleared.id == opened.id
    assert cleared.last_seen == T0   # the last event time it was seen at, whatever the worker's clock
    # its next round was stamped before the worker dropped it (collection and transport take a while)
    h.handle([metric("iptables_vm_port", {"protected": 0}, port, T0 + 690),
              metric("iptables_ruleset", {"base_fingerprint": "a"}, {"host": "hv-back"}, T0 + 690)], T0 + 701)
    [(event, again)] = h.drain_outbox()
    assert event == "opened" and again.first_seen >= cleared.last_seen


def test_samples_a_detector_refuses_leave_no_state_behind() -> None:
    """Before: a refused Keystone sample of a new host (a credential row without its access key) made that
    host's state and kept it: never written, never dropped by the TTL or the cap (it was never seen), one
    more per host name in a poison stream, each walked by every batch's books."""
    h = KeystoneHandler()
    h.bound_state(max_clock_skew_s=SKEW, state_ttl_s=600, max_state_keys=10)
    h.handle([metric("s3_frontend_credential", {"keystone_validations": 3}, {"host": f"poison-{i}"}, T0)
              for i in range(50)], T0)
    assert h.rejected == 50 and len(h.drain_rejected()) == 21   # 20 dead letters and a summary
    assert h.hosts == {} and h.touched() == set()
    # a host with state keeps it when one of its samples is refused
    h.handle([metric("keystone_probe", {"p50_ms": 9.0, "count": 5}, {"host": "ks-ok", "probe": "token"}, T0)], T0)
    h.handle([metric("s3_frontend_credential", {"keystone_validations": 3}, {"host": "ks-ok"}, T0 + 60)], T0 + 60)
    assert set(h.hosts) == {"ks-ok"} and h.hosts["ks-ok"].regimes


def test_a_restored_anomaly_series_from_the_future_is_not_pinned(clock: Clock) -> None:
    """Before: the anomaly handler restored its series' replay guard as it was stored, unlike the other
    handlers (``trusted_time``): a state written by a worker whose clock ran a day ahead skipped every
    point of the series as a replay for that day (no score, no finding)."""
    h = AnomalyHandler(AnomalySettings(series=[SeriesSpec(metric="ipmi_power", field="watts")]), 300.0)
    tags = {"host": "st-a"}
    h.handle([metric("ipmi_power", {"watts": 150.0 + i}, tags, T0 + 60 * i) for i in range(5)], T0 + 300)
    [key] = h.series
    state = orjson.loads(orjson.dumps(h.state_of(key)))
    state["last_ts"] = T0 + 86_400.0   # what a worker a day ahead persisted
    fresh = AnomalyHandler(h.settings, 300.0)
    fresh.restore({key: state})
    n = fresh.series[key].detector.n
    fresh.handle([metric("ipmi_power", {"watts": 155.0}, tags, T0 + 360)], T0 + 360)
    assert fresh.series[key].detector.n == n + 1 and fresh.series[key].last_ts == T0 + 360
    # a restored guard within the skew still stops a replay
    fresh.handle([metric("ipmi_power", {"watts": 999.0}, tags, T0 + 300)], T0 + 400)
    assert fresh.series[key].detector.n == n + 1


def _monotonic(events: list[tuple[str, Finding]]) -> list[str]:
    """What goes back in event time, per finding id (what the paging actuator would drop as stale)."""
    newest: dict[str, float] = {}
    wrong = []
    for event, f in events:
        t = f.first_seen if event == "opened" else f.last_seen
        if t < newest.get(f.id, t):
            wrong.append(f"{event} {f.detector} {f.where} at {t - T0:+.0f} s, "
                         f"after a record at {newest[f.id] - T0:+.0f} s")
        newest[f.id] = max(newest.get(f.id, t), f.last_seen)
    return wrong


def test_a_role_compared_by_a_lagging_partitions_batch_does_not_stamp_its_findings_back_in_time() -> None:
    """Before: the drift of a role was stamped with the newest report of the batch that compared it; the
    hypervisors of a partition lagging two minutes behind re-opened a drift finding cleared a minute
    before by the other partition's batch with a time before that clear (dropped by paging: no page)."""
    def ruleset(hv: str, ts: float, base: str) -> Metric:
        return metric("iptables_ruleset", {"base_fingerprint": base}, {"host": hv}, ts)

    h = FirewallHandler()
    events: list[tuple[str, Finding]] = []
    # partition 0 (hv-a, hv-b, hv-c, hv-f) is caught up; partition 1 (hv-d, hv-e, hv-g) is two minutes behind
    for batch, received in [([ruleset("hv-a", T0, "x"), ruleset("hv-b", T0, "x"), ruleset("hv-c", T0, "y")], T0),
                            ([ruleset("hv-d", T0 - 120, "y"), ruleset("hv-e", T0 - 120, "y")], T0 + 1),
                            ([ruleset(hv, T0 + 60, "x") for hv in ("hv-a", "hv-b", "hv-f")], T0 + 60),
                            ([ruleset(hv, T0 - 60, "y") for hv in ("hv-d", "hv-e", "hv-g")], T0 + 61)]:
        h.handle(batch, received)
        events += h.drain_outbox()
    assert [e for e, _ in events].count("opened") >= 4
    assert _monotonic(events) == []


def watts(host: str, w: float, ts: float) -> Metric:
    return metric("ipmi_power", {"watts": w}, {"host": host, "generation": "gen3", "raw_capacity_tb": "96"}, ts)


def test_a_generation_compared_by_a_lagging_partitions_batch_does_not_stamp_its_findings_back_in_time() -> None:
    h = PowerHandler(PowerSettings(min_samples=1))
    events: list[tuple[str, Finding]] = []
    # partition 0 (st-a, st-b, st-c, st-f, st-g) is caught up; partition 1 (the others) two minutes behind
    for batch, received in [([watts("st-a", 150, T0), watts("st-b", 150, T0), watts("st-c", 300, T0)], T0),
                            ([watts("st-d", 300, T0 - 120), watts("st-e", 300, T0 - 120)], T0 + 1),
                            ([watts("st-f", 150, T0 + 60), watts("st-g", 150, T0 + 60)], T0 + 60),
                            ([watts("st-h", 300, T0 - 60), watts("st-i", 300, T0 - 60)], T0 + 61)]:
        h.handle(batch, received)
        events += h.drain_outbox()
    assert any(e == "opened" and f.detector == "power.generation_deviation" for e, f in events)
    assert _monotonic(events) == []
