"""Findings reach the topic at least once, in order per finding id, while the worker runs (FindingsSink's outbox).

A fake producer stands in for Faust's ``topic.send``: ``send`` hands a record over and returns its delivery
future, resolved strictly in hand-over order (one partition's log) as the broker's mode says; or ``send``
raises, or never returns. Unit tests pin each rule (a failed send or delivery is sent again, an
acknowledgement not in time counts as not sent, later events of an id wait behind its unsent one, other ids
go on, the cap drops the oldest, ``opsloop_findings_total`` counts each event once, the retry service).

Seeded schedules mix batches of lifecycle events, empty batches, the retry service's calls and broker
modes (up, refusing, stalled, slow, rejecting, flaky) at random. Checked: per finding id the events that
reached the topic, a re-sent event's copies collapsed, are the events published, in order, except events
the cap dropped (counted and logged by id); once the broker is back nothing else is missing; the outbox
never exceeds its cap. ``OPSLOOP_SCHEDULE_SEED=N`` runs another block of seeds; a failure names its seed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import Counter as Tally, deque
from typing import Any, Coroutine, TypeVar

import pytest
from prometheus_client import REGISTRY

from opsloop.config import Settings
from opsloop.records import Finding, Severity
from opsloop.streams.agents.findings_sink import ActiveFindings, FindingsRetry, FindingsSink
from opsloop.streams.agents.stateful import StatefulAgent
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.power.handler import PowerHandler
from tests.helpers import run_on_virtual_clock
from tests.streams.agents.test_runtime import FakeTable, loop_for, round_event

T0 = 1_790_000_000.0
DETECTOR = "delivery.test"
TIMEOUT_S = 0.05   # the sink's delivery timeout in the unit tests (the schedules use less)
Record = tuple[bytes, bytes, dict[str, bytes]]
R = TypeVar("R")


def finding(host: str, n: int, cleared: bool = False) -> Finding:
    """Event ``n`` of the finding about ``host`` (``n`` in ``last_seen``: every event's value is its own)."""
    return Finding(detector=DETECTOR, what="test finding", where={"host": host}, severity=Severity.CRITICAL,
                   score=0.0 if cleared else 1.0, first_seen=T0, last_seen=T0 + n, cleared=cleared)


def fid(host: str) -> str:
    return finding(host, 0).id


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def counts() -> dict[str, float]:
    """The sink's counters for DETECTOR (tests compare before and after: counters are process-wide)."""
    return {"total": sum(sample("opsloop_findings_total", detector=DETECTOR, severity="critical", event=e)
                         for e in ("opened", "updated", "refreshed", "cleared")),
            "errors": sample("opsloop_findings_send_errors_total", detector=DETECTOR),
            "retries": sample("opsloop_findings_send_retries_total", detector=DETECTOR),
            "dropped": sample("opsloop_findings_dropped_total", detector=DETECTOR)}


def delta(before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in counts().items()}


def outbox_gauge() -> float:
    return sample("opsloop_findings_outbox_events")


def run(coro: Coroutine[Any, Any, R], limit_s: float = 20.0) -> R:
    """Run ``coro`` on a virtual clock (the sink's deadlines are the loop's: they pass when the code waits, not
    when a loaded machine is slow between two steps), failing (not hanging) if it waits longer than ``limit_s``."""
    return run_on_virtual_clock(coro, limit_s)


class Broker:
    """One partition of the findings topic behind a fake producer.

    ``send`` queues the record and returns its delivery future; the queue is resolved strictly in order,
    as the mode says: ``up`` every record reaches the topic, ``reject`` every one fails (a batch expired),
    ``slow`` none is resolved yet (the producer still retrying), ``flaky`` each reaches the topic, fails, or
    reaches the topic and fails all the same (the acknowledgement lost: the re-send is a duplicate), at
    random. ``refuse``: send raises (metadata unknown, buffer full); ``stall``: send never returns (the
    producer waiting for metadata). ``fail_next`` fails that many deliveries whatever the mode;
    ``refuse_keys``: sends of those keys raise whatever the mode."""

    MODES = ("up", "reject", "slow", "flaky", "refuse", "stall")

    def __init__(self, rng: random.Random | None = None) -> None:
        self.mode = "up"
        self.rng = rng or random.Random(0)
        self.queue: deque[tuple[Record, asyncio.Future[None]]] = deque()
        self.topic: list[Record] = []        # what the broker acknowledged, in log order
        self.handed: list[Record] = []       # every record a send accepted
        self.calls = 0
        self.fail_next = 0
        self.refuse_keys: set[bytes] = set()

    async def send(self, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> asyncio.Future[None]:
        self.calls += 1
        if self.mode == "refuse" or key in self.refuse_keys:
            raise ConnectionError("broker away")
        if self.mode == "stall":
            await asyncio.Event().wait()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        record = (key, value, dict(headers))
        self.queue.append((record, fut))
        self.handed.append(record)
        self.pump()
        return fut

    def set(self, mode: str) -> None:
        self.mode = mode
        self.pump()

    def pump(self) -> None:
        while self.queue and self.mode in ("up", "reject", "flaky"):
            record, fut = self.queue.popleft()
            luck = self.rng.random() if self.mode == "flaky" else 0.0
            if self.fail_next > 0 or self.mode == "reject" or luck > 0.5:
                self.fail_next = max(0, self.fail_next - 1)
                if luck > 0.8:
                    self.topic.append(record)   # written, the acknowledgement lost
                fut.set_exception(ConnectionError("batch expired"))
            else:
                self.topic.append(record)
                fut.set_result(None)

    def events(self) -> list[tuple[str, str]]:
        """(host, event) of what reached the topic, in order."""
        return [(Finding.decode(v).where["host"], h["event"].decode()) for _, v, h in self.topic]


def make_sink(broker: Broker, timeout_s: float = TIMEOUT_S, cap: int = 1000) -> FindingsSink:
    sink = FindingsSink(broker.send, ActiveFindings())
    sink.delivery_timeout_s, sink.max_outbox = timeout_s, cap
    return sink


# ------------------------------------------------------------------------------------------- unit tests
def test_a_cleared_whose_send_raised_is_sent_again_and_arrives() -> None:
    broker, before = Broker(), counts()
    sink = make_sink(broker)

    async def go() -> None:
        assert await sink.publish([("opened", finding("h", 1))]) == 1
        broker.set("refuse")
        assert await sink.publish([("cleared", finding("h", 2, cleared=True))]) == 0
        assert outbox_gauge() == 1
        broker.set("up")
        assert await sink.publish([]) == 1    # the next batch sends it, findings of its own or not

    run(go())
    assert broker.events() == [("h", "opened"), ("h", "cleared")]
    assert outbox_gauge() == 0
    assert delta(before) == {"total": 2, "errors": 1, "retries": 1, "dropped": 0}


def test_a_failed_delivery_counts_as_not_sent_and_is_sent_again() -> None:
    broker, before = Broker(), counts()
    sink = make_sink(broker)

    async def go() -> None:
        broker.set("reject")                  # send returns at once; the delivery fails
        assert await sink.publish([("cleared", finding("h", 1, cleared=True))]) == 0
        broker.set("up")
        assert await sink.publish([]) == 1

    run(go())
    assert broker.events() == [("h", "cleared")]
    assert delta(before)["errors"] == 1 and delta(before)["retries"] == 1


def test_an_acknowledgement_not_in_time_counts_as_not_sent_and_a_late_one_is_not_sent_twice() -> None:
    broker, before = Broker(), counts()
    sink = make_sink(broker)

    async def go() -> float:
        broker.set("slow")
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await sink.publish([("opened", finding("h", 1))]) == 0
        waited = loop.time() - start
        assert outbox_gauge() == 1
        start = loop.time()
        assert await sink.publish([]) == 0    # still in flight: looked at, neither sent again nor waited for
        assert loop.time() == start           # (the loop's clock moves only while the code waits)
        broker.set("up")                      # the acknowledgement comes late
        assert await sink.publish([]) == 1    # ... and is taken for what it is
        return waited

    waited = run(go())
    assert waited == pytest.approx(TIMEOUT_S)   # bounded by the delivery timeout: waited for it, no longer
    assert broker.calls == 1 and broker.events() == [("h", "opened")]
    assert delta(before) == {"total": 1, "errors": 1, "retries": 0, "dropped": 0}


def test_a_send_that_never_returns_is_cut_at_the_timeout_and_sent_again() -> None:
    broker = Broker()
    sink = make_sink(broker)

    async def go() -> None:
        broker.set("stall")
        assert await sink.publish([("cleared", finding("h", 1, cleared=True))]) == 0
        broker.set("up")
        assert await sink.publish([]) == 1

    run(go(), limit_s=5.0)
    assert broker.events() == [("h", "cleared")]


def test_later_events_of_an_id_wait_behind_its_unsent_one() -> None:
    broker = Broker()
    sink = make_sink(broker)

    async def go() -> None:
        broker.set("refuse")
        await sink.publish([("opened", finding("h", 1))])
        await sink.publish([("cleared", finding("h", 2, cleared=True))])
        assert broker.calls == 2              # the opened twice; the cleared waits behind it, not tried
        broker.set("slow")                    # the broker would take the cleared now; the opened is in flight
        await sink.publish([])
        await sink.publish([])
        assert [Finding.decode(v).last_seen - T0 for _, v, _ in broker.handed] == [1]
        broker.set("up")
        assert await sink.publish([]) == 2    # the opened acknowledged, then the cleared sent after it

    run(go())
    assert broker.events() == [("h", "opened"), ("h", "cleared")]


def test_two_events_of_an_id_in_one_batch_go_one_after_the_other() -> None:
    """Sent together, the first failing and the second arriving, the first would come back after it."""
    broker = Broker()
    sink = make_sink(broker)

    async def go() -> None:
        broker.fail_next = 1
        assert await sink.publish([("opened", finding("h", 1)), ("cleared", finding("h", 2, cleared=True))]) == 0
        assert broker.topic == [] and len(broker.handed) == 1   # the cleared was not sent past the failure
        assert await sink.publish([]) == 2

    run(go())
    assert broker.events() == [("h", "opened"), ("h", "cleared")]


def test_other_ids_are_not_held_up_by_one_that_cannot_be_sent() -> None:
    broker = Broker()
    sink = make_sink(broker)
    broker.refuse_keys = {fid("stuck").encode()}

    async def go() -> None:
        assert await sink.publish([("opened", finding("stuck", 1)), ("opened", finding("free", 2))]) == 1
        assert await sink.publish([("cleared", finding("free", 3, cleared=True))]) == 1
        assert outbox_gauge() == 1
        broker.refuse_keys = set()
        assert await sink.publish([]) == 1

    run(go())
    assert broker.events() == [("free", "opened"), ("free", "cleared"), ("stuck", "opened")]


def test_the_cap_drops_the_oldest_counted_and_logged_by_id(caplog: pytest.LogCaptureFixture) -> None:
    broker, before = Broker(), counts()
    sink = make_sink(broker, cap=3)

    async def go() -> None:
        broker.set("refuse")
        await sink.publish([("opened", finding("a", 1)), ("cleared", finding("a", 2, cleared=True))])
        await sink.publish([("opened", finding("b", 3)), ("opened", finding("c", 4))])
        await sink.publish([("opened", finding("d", 5))])
        assert outbox_gauge() == 3
        broker.set("up")
        assert await sink.publish([]) == 3

    with caplog.at_level(logging.ERROR, logger="opsloop.stream.findings"):
        run(go())
    assert broker.events() == [("b", "opened"), ("c", "opened"), ("d", "opened")]
    assert delta(before)["dropped"] == 2
    dropped = [r.fields for r in caplog.records if getattr(r, "event", "") == "finding_dropped"]
    assert [(f["id"], f["kind"], f["detector"]) for f in dropped] == [(fid("a"), "opened", DETECTOR),
                                                                     (fid("a"), "cleared", DETECTOR)]
    assert all(r.levelno == logging.ERROR for r in caplog.records if getattr(r, "event", "") == "finding_dropped")


def test_findings_total_counts_each_event_once_however_often_it_is_sent() -> None:
    broker, before = Broker(), counts()
    active = ActiveFindings()
    sink = FindingsSink(broker.send, active)
    sink.delivery_timeout_s = TIMEOUT_S

    async def go() -> None:
        broker.set("refuse")
        await sink.publish([("opened", finding("h", 1))])
        entry = active.get(fid("h"))
        assert entry is not None and entry.active     # shown open at once, broker or not
        await sink.publish([])
        await sink.publish([])
        broker.set("up")
        assert await sink.publish([]) == 1

    run(go())
    assert delta(before) == {"total": 1, "errors": 3, "retries": 3, "dropped": 0}
    assert broker.events() == [("h", "opened")]


def test_without_a_producer_findings_are_shown_counted_and_logged_only() -> None:
    before, active = counts(), ActiveFindings()
    sink = FindingsSink(None, active)
    assert run(sink.publish([("opened", finding("h", 1))])) == 0
    assert sink.pending == 0 and active.get(fid("h")) is not None
    assert delta(before) == {"total": 1, "errors": 0, "retries": 0, "dropped": 0}


def test_the_retry_service_sends_the_outbox_when_no_batch_comes(caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker()
    sink = make_sink(broker)

    async def until(cond: Any) -> None:
        while not cond():
            await asyncio.sleep(0.005)

    async def go() -> None:
        broker.set("refuse")
        await sink.publish([("opened", finding("h", 1))])
        service = FindingsRetry(sink, interval_s=0.01)
        await service.start()
        broker.set("up")
        await until(lambda: broker.topic)          # no publish: the service sent it
        broker.set("refuse")
        await sink.publish([("cleared", finding("h", 2, cleared=True))])
        await service.stop()                       # the worker exits with the cleared unsent

    with caplog.at_level(logging.ERROR, logger="opsloop.stream.findings"):
        run(go(), limit_s=5.0)
    assert broker.events() == [("h", "opened")]
    [stop] = [r.fields for r in caplog.records if getattr(r, "event", "") == "findings_unsent_at_stop"]
    assert stop["events"] == 1 and stop["by_detector"] == {DETECTOR: 1} and stop["oldest_id"] == fid("h")


def test_the_agent_applies_the_stream_settings_and_publishes_once_per_batch() -> None:
    agent = loop_for(FirewallHandler(), FakeTable(), [], PowerHandler())
    calls: list[int] = []
    publish = agent.sink.publish

    async def counting(publications: Any) -> int:
        publications = list(publications)
        calls.append(len(publications))
        return await publish(publications)

    agent.sink.publish = counting  # type: ignore[method-assign]
    run(agent.run_batch([round_event("hv1", T0, 0, 0, open_port=True)]))
    assert calls == [1]                           # every handler's findings in one publish: one wait
    settings = Settings.model_validate({"stream": {"findings_delivery_timeout_s": 1.5, "findings_outbox_max": 7}})
    sink = FindingsSink(None, ActiveFindings())
    StatefulAgent(agent.app, [FirewallHandler()], settings, FakeTable(), sink)  # type: ignore[arg-type]
    assert (sink.delivery_timeout_s, sink.max_outbox) == (1.5, 7)


def test_the_delivery_settings_default_to_a_few_seconds_and_a_bounded_outbox() -> None:
    s = Settings().stream
    assert (s.findings_delivery_timeout_s, s.findings_retry_interval_s, s.findings_outbox_max) == (5.0, 5.0, 10_000)
    sink = FindingsSink(None, ActiveFindings())
    assert (sink.delivery_timeout_s, sink.max_outbox) == (5.0, 10_000)   # the sink's defaults are the section's
    s = Settings.model_validate({"stream": {"findings_delivery_timeout_s": 2, "findings_retry_interval_s": 1,
                                            "findings_outbox_max": 500}}).stream
    assert (s.findings_delivery_timeout_s, s.findings_retry_interval_s, s.findings_outbox_max) == (2.0, 1.0, 500)


@pytest.mark.parametrize("stream", [{"findings_delivery_timeout_s": 0}, {"findings_outbox_max": 0},
                                    {"findings_retry_interval_s": -1}, {"findings_delivery_timeout_s": "soon"}])
def test_the_delivery_settings_are_validated(stream: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="findings_"):
        Settings.model_validate({"stream": stream})


# ------------------------------------------------------------------------------------------- schedules
# deterministic by default; OPSLOOP_SCHEDULE_SEED=N explores another block of seeds (the failure names it)
SEED_BASE = int(os.environ.get("OPSLOOP_SCHEDULE_SEED", "0"))
SEEDS = range(SEED_BASE, SEED_BASE + 30)
STEPS = 100
HOSTS = ("h0", "h1", "h2", "h3", "h4", "h5")


class Lifecycle:
    """Lifecycle events of the findings about HOSTS, as a FindingBook publishes them (opened, then
    updated / refreshed, then cleared, and opened again); every event has its own number."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.open: dict[str, bool] = {h: False for h in HOSTS}
        self.published: dict[str, list[int]] = {h: [] for h in HOSTS}
        self.n = 0

    def next(self) -> tuple[str, Finding]:
        host = self.rng.choice(HOSTS)
        self.n += 1
        if not self.open[host]:
            event = "opened"
        else:
            event = self.rng.choice(("updated", "refreshed", "refreshed", "cleared"))
        self.open[host] = event != "cleared"
        self.published[host].append(self.n)
        return event, finding(host, self.n, cleared=event == "cleared")


async def run_schedule(seed: int) -> tuple[Lifecycle, Broker, FindingsSink]:
    rng = random.Random(seed)
    broker = Broker(random.Random(seed * 7919 + 1))
    cap = rng.choice((3, 8, 1000))
    sink = make_sink(broker, timeout_s=0.003, cap=cap)
    life = Lifecycle(rng)
    for step in range(STEPS):
        where = f"seed {seed} step {step}"
        if rng.random() < 0.2:
            broker.set(rng.choice(("up", "up", *Broker.MODES)))   # recoveries as often as any failure
        r = rng.random()
        if r < 0.55:
            await sink.publish([life.next() for _ in range(rng.randint(1, 4))])
        elif r < 0.8:
            await sink.publish([])            # a batch without findings
        else:
            await sink.retry()                # the retry service's tick
        assert sink.pending <= cap, f"{where}: outbox {sink.pending} over its cap {cap}"
        assert outbox_gauge() == sink.pending, where
    broker.set("up")                          # failures stop: everything not dropped gets through
    # ... within one call given time for it (the contract is delivery, not delivery within the schedule's 3 ms)
    sink.delivery_timeout_s = 30.0
    await sink.publish([])
    assert sink.pending == 0, f"seed {seed}: {sink.pending} events still unsent with the broker up"
    return life, broker, sink


@pytest.mark.parametrize("seed", SEEDS)
def test_schedule(seed: int, caplog: pytest.LogCaptureFixture) -> None:
    before = counts()
    with caplog.at_level(logging.ERROR, logger="opsloop.stream.findings"):
        life, broker, sink = run(run_schedule(seed), limit_s=60.0)
    drops = Tally(r.fields["id"] for r in caplog.records if getattr(r, "event", "") == "finding_dropped")
    total = sum(len(v) for v in life.published.values())
    assert delta(before)["total"] == total, f"seed {seed}: each published event counted once"
    assert delta(before)["dropped"] == sum(drops.values()) == sink.dropped, f"seed {seed}"
    arrived: dict[str, list[int]] = {h: [] for h in HOSTS}
    for _, value, headers in broker.topic:
        f = Finding.decode(value)
        arrived[f.where["host"]].append(int(f.last_seen - T0))
    for host in HOSTS:
        where, seq, published = f"seed {seed} host {host}", arrived[host], life.published[host]
        # a re-sent event's copies side by side, never after a newer event of the id
        assert seq == sorted(seq), f"{where}: out of order {seq} (published {published})"
        assert set(seq) <= set(published), f"{where}: {seq} not published"
        missing = [n for n in published if n not in set(seq)]
        assert len(missing) <= drops[fid(host)], f"{where}: lost {missing}, dropped {drops[fid(host)]}"
