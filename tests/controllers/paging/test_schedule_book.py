"""Seeded schedules against the paging loop: detectors raise, re-raise, change severity and clear a few
findings (one of them with 40 more labels of 1024 characters, the most a record takes); the topic carries
producer retries, stale copies of older records and bad records (not JSON, unknown fields, stamped a day
ahead); Alertmanager goes away and comes back; the actuator crashes at any point of a step (before or after
Alertmanager takes a post, mid-write of its state file, after a save, at the commit) and restarts from its state
file and the committed offset.

Driven through the real ``PagingService.step`` on a simulated clock, with a one-partition fake consumer and a
fake Alertmanager that pages as a real one does: when a label set goes from not firing to firing in one
body, and again after an alert expired at its endsAt.

After every step: no label set paged more often than the detectors' own history opens it (no duplicate
page from a replay, a redelivery or a stale record), the resolve queue within its bound and its counter
consistent. At the end (Alertmanager up, everything consumed and delivered): Alertmanager fires exactly the
findings the detectors hold open, at their severity (no page lost, no incident resolved by a stale clear).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from opsloop.controllers.paging.alertmanager import AlertmanagerError, Backoff, PostResult
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging import service as paging_service
from opsloop.controllers.paging.service import PagingService
from opsloop.records import Finding, Severity
from tests.helpers import ConsumerMsg

T0 = 1_795_310_400.0
HOSTS = ("h0", "h1", "h2")
SEVERITIES = (Severity.INFO, Severity.WARNING, Severity.CRITICAL)   # info never pages (min_severity warning)
MAX_PENDING = 3
SEEDS = range(60)
CRASHES = (None, None, None, "before_post", "posted", "torn", "saved", "commit")


def at(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class FakeAlertmanager:
    """One Alertmanager: which label sets fire until when, the pages it sends and the alerts that expired.

    ``up`` is whether the actuator reaches it; alerts expire at their endsAt either way."""

    def __init__(self) -> None:
        self.up = True
        self.firing: dict[tuple[str, str], float] = {}   # label set -> endsAt
        self.pages: dict[tuple[str, str], int] = {}
        self.expired: dict[tuple[str, str], int] = {}
        self.now = T0

    def tick(self, now: float) -> None:
        self.now = now
        for key, ends in list(self.firing.items()):
            if ends <= now:
                del self.firing[key]
                self.expired[key] = self.expired.get(key, 0) + 1

    def post(self, alerts: list[dict[str, Any]]) -> PostResult:
        if not self.up:
            raise AlertmanagerError("http://am.test: connection refused")
        before = set(self.firing)
        for a in alerts:
            key = (a["labels"]["host"], a["labels"]["severity"])
            ends = at(a["endsAt"])
            if ends > self.now:
                self.firing[key] = ends
            else:
                self.firing.pop(key, None)
        # one body is one update of the group: a resolve and a firing alert of one label set in it notify
        # nothing new (Alertmanager notifies the state it holds when the group flushes)
        for key in set(self.firing) - before:
            self.pages[key] = self.pages.get(key, 0) + 1
        return PostResult(accepted=len(alerts))

    def close(self) -> None:
        pass


@dataclass
class Detectors:
    """The truth: which incident of each host is open, at which severity, and the pages it should cost."""

    rng: random.Random
    open: dict[str, tuple[float, Severity]] = field(default_factory=dict)
    pages: dict[tuple[str, str], int] = field(default_factory=dict)

    def publish(self, now: float) -> Finding:
        host = self.rng.choice(HOSTS)
        incident = self.open.get(host)
        if incident is None:
            sev = self.rng.choice(SEVERITIES)
            self.open[host] = (now, sev)
            self._paged(host, sev)
            return make(host, sev, now, now)
        first_seen, sev = incident
        roll = self.rng.random()
        if roll < 0.35:
            del self.open[host]
            return make(host, sev, first_seen, now, cleared=True)
        if roll < 0.55:
            new = self.rng.choice([s for s in SEVERITIES if s is not sev])
            self.open[host] = (first_seen, new)
            self._paged(host, new)
            return make(host, new, first_seen, now)
        return make(host, sev, first_seen, now)   # heartbeat

    def _paged(self, host: str, sev: Severity) -> None:
        if sev is not Severity.INFO:
            self.pages[(host, sev.value)] = self.pages.get((host, sev.value), 0) + 1


def make(host: str, sev: Severity, first_seen: float, last_seen: float, cleared: bool = False) -> Finding:
    # the last host's findings carry 40 more labels of 1024 characters (the record's bound): cut to 256, still one alert
    more = {f"k{i:02d}": "v" * 1024 for i in range(40)} if host == HOSTS[-1] else {}
    return Finding(detector="anomaly.power", what="power off its model", where={"host": host, **more},
                   severity=sev, first_seen=first_seen, last_seen=last_seen, cleared=cleared)


class Crash(BaseException):
    """The process dies here (not an Exception: nothing in the service may catch it)."""


class Consumer:
    """One partition of the findings topic, read from the committed offset in batches of 1 to 4."""

    def __init__(self, act: "Actuator") -> None:
        self.act = act
        self.position = act.committed

    def poll(self, timeout_ms: int = 0) -> dict[int, list[ConsumerMsg]]:
        n = self.act.rng.randint(1, 4)
        values = self.act.topic[self.position:self.position + n]
        batch = [ConsumerMsg("findings", 0, self.position + i, None, v) for i, v in enumerate(values)]
        self.position += len(batch)
        return {0: batch} if batch else {}

    def commit(self, timeout_ms: int | None = None) -> None:
        self.act.crash_point("commit")
        self.act.committed = self.position


class Actuator:
    """The real ``PagingService.step`` on a simulated clock; it crashes where told and restarts from its
    state file and the committed offset."""

    def __init__(self, tmp: Path, am: FakeAlertmanager, rng: random.Random, topic: list[bytes]) -> None:
        self.cfg = PagingConfig(state_file=tmp / "state.json", start_offset="latest", resend_interval_s=60,
                                backoff_initial_s=1, backoff_max_s=8, max_pending_resolves=MAX_PENDING)
        self.am, self.rng, self.topic = am, rng, topic
        self.committed = 0
        self.crash: str | None = None
        self.restart()

    def crash_point(self, where: str) -> None:
        if self.crash == where:
            self.crash = None
            raise Crash(where)

    def restart(self) -> None:
        self.svc = PagingService(self.cfg, "127.0.0.1:1", consumer=Consumer(self), producer=None,
                                 client=self)  # type: ignore[arg-type]
        self.svc.backoff = Backoff(1, 8, rng=random.Random(self.rng.random()))
        real_save = self.svc.save_state

        def save_state() -> None:
            if self.crash == "torn":   # dies while writing: half a temporary file, the old state file stays
                self.cfg.state_file.with_suffix(".json.tmp").write_bytes(b'{"version": 1, "open": [{"fin')
            self.crash_point("torn")
            real_save()
            self.crash_point("saved")

        self.svc.save_state = save_state  # type: ignore[method-assign]
        self.svc.load_state()

    # the Alertmanager client: crashes before or after the fake Alertmanager took the body
    def post(self, alerts: list[dict[str, Any]]) -> PostResult:
        self.crash_point("before_post")
        result = self.am.post(alerts)
        self.crash_point("posted")
        return result

    def close(self) -> None:
        pass

    def step(self, crash: str | None) -> None:
        self.crash = crash
        try:
            self.svc.step()
        except Crash:
            self.restart()
        self.crash = None


def check(act: Actuator, am: FakeAlertmanager, truth: Detectors, where: str) -> None:
    book = act.svc.book
    for key, n in am.pages.items():   # an alert that expired in an outage pages again when re-sent: fair
        allowed = truth.pages.get(key, 0) + am.expired.get(key, 0)
        assert n <= allowed, f"{where}: {key} paged {n} times, its detector opened it " \
                             f"{truth.pages.get(key, 0)} times, it expired {am.expired.get(key, 0)} times"
    assert book.pending_resolves() == sum(len(q) for q in book.resolves.values()) <= MAX_PENDING, where
    assert set(book.open) <= {make(h, Severity.WARNING, T0, T0).id for h in HOSTS}, where


class Clock:
    now = T0

    def time(self) -> float:
        return self.now


clock = Clock()


def run_schedule(seed: int, tmp: Path, stale: bool = True, crashes: tuple[str | None, ...] = CRASHES,
                 outages: bool = True, bad: bool = True) -> list[str]:
    real_time = paging_service.time
    paging_service.time = clock   # type: ignore[assignment]   # step() reads the wall clock: ours instead
    try:
        return _run(seed, tmp, stale, crashes, outages, bad)
    finally:
        paging_service.time = real_time


def _run(seed: int, tmp: Path, stale: bool, crashes: tuple[str | None, ...], outages: bool,
         bad: bool) -> list[str]:
    rng = random.Random(seed)
    am = FakeAlertmanager()
    truth = Detectors(random.Random(seed * 7919 + 1))
    topic: list[bytes] = []
    act = Actuator(tmp, am, rng, topic)
    now = T0
    trace: list[str] = []
    for i in range(120):
        now += rng.uniform(0.5, 20.0)
        am.tick(now)
        roll = rng.random()
        if roll < 0.35:
            f = truth.publish(now)
            topic.append(f.encode())
            if rng.random() < 0.2:   # the producer's retry: the same record twice
                topic.append(f.encode())
            trace.append(f"publish {f.where['host']} {f.severity.value} first={f.first_seen - T0:.0f} "
                         f"last={f.last_seen - T0:.0f} cleared={f.cleared}")
        elif roll < 0.42 and topic and stale:   # an older record again, after newer ones (out of order)
            topic.append(rng.choice(topic))
            trace.append("stale copy")
        elif roll < 0.46 and bad:   # not a finding, or one stamped a day ahead: refused, counted, passed by
            host = rng.choice(HOSTS)
            topic.append(rng.choice([
                b"\xff garbage", b"", b'{"detector": "anomaly.power"}', b"[1]",
                orjson.dumps({**orjson.loads(make(host, Severity.CRITICAL, now, now).encode()), "colour": "red"}),
                make(host, Severity.CRITICAL, now, now + 86_400).encode(),
                make(host, Severity.WARNING, now + 86_400, now + 86_400, cleared=True).encode(),
            ]))
            trace.append("bad record")
        elif roll < 0.52 and outages:
            am.up = not am.up
            trace.append(f"alertmanager {'up' if am.up else 'down'}")
        else:
            crash = rng.choice(crashes)
            clock.now = now
            act.step(crash)
            trace.append(f"step crash={crash}")
        check(act, am, truth, f"seed {seed} event {i}: " + " | ".join(trace[-8:]))
    am.up = True
    for _ in range(100):   # quiesce: everything consumed, delivered and committed, then past any endsAt
        now += 10.0
        am.tick(now)
        clock.now = now
        act.step(None)
        if act.committed == len(topic) and act.svc.book.pending(now) == 0:
            break
    for _ in range(30):    # a resolve dropped over the bound ends at its endsAt
        now += 10.0
        am.tick(now)
        clock.now = now
        act.step(None)
    check(act, am, truth, f"seed {seed} end")
    want = {(h, sev.value) for h, (_, sev) in truth.open.items() if sev is not Severity.INFO}
    assert set(am.firing) == want, f"seed {seed}: Alertmanager fires {sorted(am.firing)}, detectors hold " \
                              f"{sorted(want)}\n" + "\n".join(trace)
    return trace


@pytest.mark.parametrize("seed", SEEDS)
def test_schedule(seed: int, tmp_path: Path) -> None:
    run_schedule(seed, tmp_path)
