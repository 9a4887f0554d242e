"""Findings not yet acknowledged survive a worker stop and a crash: FindingsSink's outbox file.

The real FindingsSink, the fake one-partition broker of ``test_findings_delivery`` (``send`` returns a
delivery future resolved in hand-over order as its mode says). A "stop" is the retry service's stop hook; a
"crash" drops the sink object after a call whose wait timed out, nothing else. A new sink on the same
``outbox_path`` is the restarted worker. Checked: the saved events are sent first, in order per id, before
new ones; nothing is written when every acknowledgement comes within the wait; the file goes once the outbox
drains; it is 0600; a torn (at every byte offset) or otherwise unreadable file is logged, counted, moved
aside and the worker starts empty and delivers; an event that no longer parses is skipped, the others kept;
the cap applies to restored events; seeded schedules with crashes lose nothing and keep per-id order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import stat
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import orjson
import pytest

from opsloop.config import load_settings
from opsloop.log import Sampled
from opsloop.records import Finding
from opsloop.streams.agents import findings_sink as sink_module
from opsloop.streams.agents.findings_sink import (OUTBOX_FILE, ActiveFindings, FindingsRetry, FindingsSink,
                                                  parse_outbox)
from opsloop.streams.agents.stateful import findings_sink
from opsloop.streams.runtime.app import create_app
from tests.streams.agents.test_findings_delivery import (DETECTOR, T0, Broker, counts, delta, fid, finding,
                                                         outbox_gauge, run, sample)

TIMEOUT_S = 0.05
LOGGER = "opsloop.stream.findings"


def make_sink(broker: Broker, path: Path | None, *, timeout_s: float = TIMEOUT_S, cap: int = 1000,
              active: ActiveFindings | None = None) -> FindingsSink:
    return FindingsSink(broker.send, active or ActiveFindings(), delivery_timeout_s=timeout_s, max_outbox=cap,
                        outbox_path=path)


def handed(broker: Broker) -> list[tuple[str, str, int]]:
    """(host, event, n) of every record handed to the producer, in order."""
    out = []
    for _, value, headers in broker.handed:
        f = Finding.decode(value)
        out.append((f.where["host"], headers["event"].decode(), int(f.last_seen - T0)))
    return out


def file_errors(reason: str) -> float:
    return sample("opsloop_findings_outbox_file_errors_total", reason=reason)


def events_of(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", "") == name]


async def outage(path: Path, mode: str = "refuse") -> Broker:
    """A run whose broker never acknowledges: a opened, b opened, a cleared (two batches), left waiting."""
    broker = Broker()
    broker.set(mode)
    sink = make_sink(broker, path)
    await sink.publish([("opened", finding("a", 1)), ("opened", finding("b", 2))])
    await sink.publish([("cleared", finding("a", 3, cleared=True))])
    assert sink.pending == 3
    return broker


RESTORED_THEN_NEW = [("a", "opened", 1), ("b", "opened", 2), ("c", "opened", 4),   # wave 1: oldest of each id
                     ("a", "cleared", 3), ("b", "cleared", 5)]                    # wave 2: the next of each id


async def restart(path: Path) -> tuple[Broker, FindingsSink]:
    """The restarted worker on the same data dir, the broker back, a first batch with new events."""
    broker = Broker()
    sink = make_sink(broker, path)
    assert sink.pending == 3 and sink.restored == 3 and outbox_gauge() == 3
    assert await sink.publish([("opened", finding("c", 4)), ("cleared", finding("b", 5, cleared=True))]) == 5
    return broker, sink


# ------------------------------------------------------------------------------------ stop and crash
def test_events_pending_at_stop_are_saved_and_sent_first_by_the_next_run(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / OUTBOX_FILE

    async def first_run() -> None:
        broker = Broker()
        sink = make_sink(broker, path)
        service = FindingsRetry(sink, interval_s=60.0)
        await service.start()
        broker.set("refuse")
        await sink.publish([("opened", finding("a", 1)), ("opened", finding("b", 2))])
        await sink.publish([("cleared", finding("a", 3, cleared=True))])
        await service.stop()                       # the worker stops with three events unsent

    with caplog.at_level(logging.INFO, logger=LOGGER):
        run(first_run())
        [stop] = events_of(caplog, "findings_unsent_at_stop")
        assert stop.levelno == logging.WARNING     # saved: not lost any more
        assert stop.fields["saved"] is True and stop.fields["path"] == str(path)   # type: ignore[attr-defined]
        assert stop.fields["events"] == 3 and stop.fields["by_detector"] == {DETECTOR: 3}  # type: ignore[attr-defined]
        assert path.exists()
        caplog.clear()
        broker, sink = run(restart(path))
        [restored] = events_of(caplog, "findings_outbox_restored")
    assert restored.fields["events"] == 3 and restored.fields["path"] == str(path)   # type: ignore[attr-defined]
    assert handed(broker) == RESTORED_THEN_NEW
    assert sink.pending == 0 and not path.exists()


@pytest.mark.parametrize("mode", ["refuse", "slow", "stall", "reject"])
def test_events_pending_at_a_crash_are_sent_first_by_the_next_run(tmp_path: Path, mode: str) -> None:
    """No stop hook: the sink is dropped after calls whose wait ran out (or whose sends failed)."""
    path = tmp_path / OUTBOX_FILE
    run(outage(path, mode))                        # the sink goes with its loop: nothing else is called
    assert path.exists()
    broker, sink = run(restart(path))
    assert handed(broker) == RESTORED_THEN_NEW
    assert not path.exists()


def test_the_file_holds_the_records_values_as_sent_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / OUTBOX_FILE
    broker = run(outage(path, "slow"))            # a and b handed over, never acknowledged
    doc = orjson.loads(path.read_bytes())
    assert doc["format"] == "opsloop.findings-outbox" and doc["version"] == 1
    assert [e["event"] for e in doc["events"]] == ["opened", "opened", "cleared"]
    # each finding is the topic's record value: what Finding.decode reads, byte for byte what was sent
    sent = [v for _, v, _ in broker.handed]
    assert [orjson.dumps(e["finding"]) for e in doc["events"]][:2] == sent[:2]
    assert [f.id for _, f in parse_outbox(path.read_bytes())[0]] == [fid("a"), fid("b"), fid("a")]


def test_the_file_is_0600(tmp_path: Path) -> None:
    path = tmp_path / OUTBOX_FILE
    old = os.umask(0)                              # even with a permissive umask
    try:
        run(outage(path))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# ------------------------------------------------------------------------------------ no cost when healthy
def test_nothing_is_written_when_every_acknowledgement_comes_in_time(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[Path] = []
    real = sink_module.replace_file
    monkeypatch.setattr(sink_module, "replace_file", lambda p, data, **kw: (writes.append(p), real(p, data, **kw)))
    path = tmp_path / OUTBOX_FILE
    broker = Broker()
    sink = make_sink(broker, path)

    async def go() -> None:
        for n in range(20):
            batch = [("opened", finding(f"h{n}", n)), ("cleared", finding(f"h{n}", n + 1, cleared=True))]
            assert await sink.publish(batch) == 2
            assert await sink.publish([]) == 0
            await sink.retry()

    run(go())
    assert writes == [] and list(tmp_path.iterdir()) == []   # no file, no temporary file


def test_the_file_is_removed_once_the_outbox_drains(tmp_path: Path) -> None:
    path = tmp_path / OUTBOX_FILE
    broker = Broker()
    sink = make_sink(broker, path)

    async def go() -> None:
        broker.set("slow")
        await sink.publish([("opened", finding("a", 1)), ("opened", finding("b", 2))])
        assert path.exists()
        broker.set("up")                           # a's and b's acknowledgements come late ...
        service = FindingsRetry(sink, interval_s=0.01)
        await service.start()                      # ... and the retry service (no batch) takes them
        while sink.pending:
            await asyncio.sleep(0.005)
        await service.stop()

    run(go())
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_the_file_is_rewritten_only_when_the_waiting_events_change(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    real = sink_module.replace_file
    monkeypatch.setattr(sink_module, "replace_file",
                        lambda p, data, **kw: (writes.append(len(parse_outbox(data)[0])), real(p, data, **kw)))
    path = tmp_path / OUTBOX_FILE
    broker = Broker()
    sink = make_sink(broker, path)

    async def go() -> None:
        broker.set("refuse")
        await sink.publish([("opened", finding("a", 1))])
        for _ in range(5):                         # an outage: batches without findings, retry rounds
            await sink.publish([])
            await sink.retry()
        await sink.publish([("opened", finding("b", 2))])
        broker.refuse_keys = {fid("b").encode()}
        broker.set("up")
        await sink.publish([])                     # a gets through, b does not
        await sink.publish([])

    run(go())
    assert writes == [1, 2, 1]
    assert [f.id for _, f in parse_outbox(path.read_bytes())[0]] == [fid("b")]


# ------------------------------------------------------------------------------------ a damaged file
async def deliver_new(path: Path) -> tuple[Broker, FindingsSink]:
    broker = Broker()
    sink = make_sink(broker, path)
    assert sink.pending == 0
    assert await sink.publish([("opened", finding("n", 9))]) == 1
    return broker, sink


def test_a_torn_file_at_every_byte_offset_is_logged_counted_and_moved_aside(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    saved = tmp_path / "saved" / OUTBOX_FILE
    run(outage(saved))
    data = saved.read_bytes()
    assert len(parse_outbox(data)[0]) == 3
    before = file_errors("unreadable")
    sampled = set(range(0, len(data), max(1, len(data) // 40))) | {0, 1, len(data) - 1}
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for cut in range(len(data)):
            work = tmp_path / f"cut{cut}"
            work.mkdir()
            path = work / OUTBOX_FILE
            path.write_bytes(data[:cut])
            caplog.clear()
            if cut in sampled:                     # new events still delivered (a sample: a loop each)
                broker, sink = run(deliver_new(path))
                assert handed(broker) == [("n", "opened", 9)], cut
            else:
                sink = make_sink(Broker(), path)
                assert sink.pending == 0, cut
            [error] = events_of(caplog, "findings_outbox_unreadable")
            fields: dict[str, Any] = error.fields   # type: ignore[attr-defined]
            assert fields["path"] == str(path) and fields["error"], cut
            assert ("empty file" if cut == 0 else "torn or damaged") in fields["error"], (cut, fields["error"])
            [aside] = [p for p in work.iterdir() if p.name.startswith(OUTBOX_FILE + ".corrupt-")]
            assert fields["moved_to"] == str(aside) and aside.read_bytes() == data[:cut], cut
            assert not path.exists()               # nothing waits: nothing written in its place
    assert file_errors("unreadable") - before == len(data)


@pytest.mark.parametrize("content, why", [
    (b"\x00\xff garbage", "not JSON"),
    (b"[1, 2]", "not a findings outbox"),
    (b'{"format": "something.else", "version": 1, "events": []}', "not a findings outbox"),
    (b'{"format": "opsloop.findings-outbox", "version": 2, "events": []}', "version 2 unknown"),
    (b'{"format": "opsloop.findings-outbox", "version": 1, "events": {}}', "events: not a list"),
])
def test_a_file_that_is_not_an_outbox_is_moved_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                     content: bytes, why: str) -> None:
    path = tmp_path / OUTBOX_FILE
    path.write_bytes(content)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        broker, _ = run(deliver_new(path))
    [error] = events_of(caplog, "findings_outbox_unreadable")
    assert why in error.fields["error"]            # type: ignore[attr-defined]
    assert handed(broker) == [("n", "opened", 9)]
    assert [p.name.split(".corrupt-")[0] for p in tmp_path.iterdir()] == [OUTBOX_FILE]


def test_only_the_newest_copies_set_aside_are_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A disk that tears the file at every start must not fill the data directory with copies: the newest
    KEEP_SET_ASIDE are kept, a file of the same prefix not named by us is left alone."""
    path = tmp_path / OUTBOX_FILE
    stranger = tmp_path / f"{OUTBOX_FILE}.corrupt-by-hand"
    stranger.write_bytes(b"an operator's copy")
    old = [tmp_path / f"{OUTBOX_FILE}.corrupt-{1000.0 + i:.3f}" for i in range(5)]
    for i, p in enumerate(old):
        p.write_bytes(b"torn %d" % i)
    path.write_bytes(b'{"format": "opsloop.findings-outbox", "ver')
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        broker, _ = run(deliver_new(path))
    assert handed(broker) == [("n", "opened", 9)]
    [error] = events_of(caplog, "findings_outbox_unreadable")
    moved = Path(error.fields["moved_to"])       # type: ignore[attr-defined]
    kept = {p.name for p in tmp_path.iterdir()}
    assert kept == {moved.name, old[-1].name, old[-2].name, stranger.name}, kept
    assert moved.read_bytes().endswith(b'"ver') and stranger.read_bytes() == b"an operator's copy"
    assert sink_module.KEEP_SET_ASIDE == 3


def test_an_unreadable_path_does_not_stop_the_worker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / OUTBOX_FILE
    path.mkdir()                                   # read_bytes raises IsADirectoryError
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        broker, _ = run(deliver_new(path))
    [error] = events_of(caplog, "findings_outbox_unreadable")
    assert "cannot read" in error.fields["error"]   # type: ignore[attr-defined]
    assert handed(broker) == [("n", "opened", 9)]


def test_events_that_no_longer_parse_are_skipped_and_counted_the_others_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / OUTBOX_FILE
    run(outage(path))
    doc = orjson.loads(path.read_bytes())
    good = doc["events"]
    bad_finding = dict(good[1]["finding"], schema_version=7)
    doc["events"] = [good[0], {"event": "reopened", "finding": good[1]["finding"]}, {"event": "opened"},
                     {"event": "opened", "finding": bad_finding}, "junk", good[1], good[2]]
    path.write_bytes(orjson.dumps(doc))
    before = file_errors("event")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        broker = Broker()
        sink = make_sink(broker, path)
        assert sink.pending == 3
        assert run(sink.publish([])) == 3
    [skipped] = events_of(caplog, "findings_outbox_events_skipped")
    fields: dict[str, Any] = skipped.fields        # type: ignore[attr-defined]
    assert fields["skipped"] == 4 and fields["kept"] == 3 and fields["path"] == str(path)
    assert [e.split(":")[0] for e in fields["errors"]] == ["events[1]", "events[2]", "events[3]", "events[4]"]
    assert "schema_version" in fields["errors"][2]
    assert file_errors("event") - before == 4
    assert handed(broker) == [("a", "opened", 1), ("b", "opened", 2), ("a", "cleared", 3)]
    assert not path.exists()                       # drained: the file with the skipped events goes too


def test_a_save_that_fails_is_counted_and_the_events_are_still_sent(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_module, "SAVE_FAILED_LOG", Sampled(60.0))   # its first line, whatever ran before
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    path = blocker / OUTBOX_FILE                   # its parent is a file: every save fails
    before = file_errors("write")
    broker = Broker()
    sink = make_sink(broker, path)

    async def go() -> None:
        broker.set("refuse")
        await sink.publish([("opened", finding("a", 1))])
        broker.set("up")
        assert await sink.publish([]) == 1

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(go())
        assert file_errors("write") - before == 1
        assert events_of(caplog, "findings_outbox_save_failed")
        broker.set("refuse")
        run(sink.publish([("opened", finding("b", 2))]))
        assert sink.log_unsent() == 1
    [stop] = events_of(caplog, "findings_unsent_at_stop")
    assert stop.levelno == logging.ERROR and stop.fields["saved"] is False   # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------ bounds, gauges, wiring
def test_the_cap_applies_to_restored_events_oldest_dropped_first(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / OUTBOX_FILE
    run(outage(path))
    before = counts()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        broker = Broker()
        sink = make_sink(broker, path, cap=2)      # a smaller cap than the run that saved them
        assert sink.pending == 2
        sink.bound_delivery(delivery_timeout_s=TIMEOUT_S, max_outbox=1)   # the stream section's, applied at once
        assert sink.pending == 1 and outbox_gauge() == 1
        assert [f.id for _, f in parse_outbox(path.read_bytes())[0]] == [fid("a")]   # the file follows
        assert run(sink.publish([])) == 1
    assert handed(broker) == [("a", "cleared", 3)]
    dropped = [(r.fields["id"], r.fields["kind"]) for r in events_of(caplog, "finding_dropped")]  # type: ignore
    assert dropped == [(fid("a"), "opened"), (fid("b"), "opened")]
    assert delta(before)["dropped"] == 2


def test_restored_events_are_resent_not_republished_and_restore_still_shows_the_detector_state(
        tmp_path: Path) -> None:
    """The run that published them counted them and showed them; ``restore`` shows what the state holds."""
    path = tmp_path / OUTBOX_FILE
    run(outage(path))
    before, active = counts(), ActiveFindings()
    broker = Broker()
    sink = make_sink(broker, path, active=active)
    assert active.get(fid("a")) is None and active.get(fid("b")) is None   # loading shows nothing
    sink.restore([finding("b", 2)])                # the detector state: b open, a cleared
    assert run(sink.publish([])) == 3
    entry = active.get(fid("b"))
    assert entry is not None and entry.active and active.get(fid("a")) is None
    assert delta(before) == {"total": 0, "errors": 0, "retries": 3, "dropped": 0}


def test_a_sink_without_a_producer_leaves_the_file_for_one_that_has_one(tmp_path: Path) -> None:
    path = tmp_path / OUTBOX_FILE
    run(outage(path))
    data = path.read_bytes()
    assert FindingsSink(None, ActiveFindings(), outbox_path=path).pending == 0
    assert path.read_bytes() == data


def test_the_worker_keeps_its_outbox_in_its_data_dir(tmp_path: Path) -> None:
    app = create_app(load_settings(None, {"stream": {"data_dir": str(tmp_path / "streams")}}), app_id="t-outbox")
    assert findings_sink(app).outbox_path == tmp_path / "streams" / OUTBOX_FILE


# ------------------------------------------------------------------------------------ schedules with crashes
SEEDS = range(12)
STEPS = 80
HOSTS = ("h0", "h1", "h2", "h3")


async def crash_schedule(seed: int, path: Path) -> tuple[dict[str, list[int]], Broker, int]:
    """Batches, retry rounds, broker modes and crashes (a new sink on the same file) at random; then the
    broker up for good. Returns each host's published event numbers, the broker and the drops."""
    rng = random.Random(seed)
    broker = Broker(random.Random(seed * 31 + 7))
    cap = rng.choice((4, 1000))
    sink = make_sink(broker, path, timeout_s=0.01, cap=cap)
    is_open = {h: False for h in HOSTS}
    published: dict[str, list[int]] = {h: [] for h in HOSTS}
    n = dropped = 0
    for step in range(STEPS):
        if rng.random() < 0.2:
            broker.set(rng.choice(("up", "up", *Broker.MODES)))
        r = rng.random()
        if r < 0.5:
            batch = []
            for _ in range(rng.randint(1, 3)):
                host, n = rng.choice(HOSTS), n + 1
                event = "opened" if not is_open[host] else rng.choice(("refreshed", "cleared"))
                is_open[host] = event != "cleared"
                published[host].append(n)
                batch.append((event, finding(host, n, cleared=event == "cleared")))
            await sink.publish(batch)
        elif r < 0.7:
            await sink.retry()
        elif r < 0.85:
            dropped += sink.dropped
            sink = make_sink(broker, path, timeout_s=0.01, cap=cap)   # a crash and a restart
        else:
            await sink.publish([])
        assert sink.pending <= cap, f"seed {seed} step {step}"
        assert path.exists() == bool(sink.pending), f"seed {seed} step {step}: file and outbox out of step"
    broker.set("up")
    sink.delivery_timeout_s = 30.0                 # one call drains it, given time (the contract is delivery)
    await sink.publish([])
    assert sink.pending == 0 and not path.exists(), f"seed {seed}: unsent with the broker up"
    return published, broker, dropped + sink.dropped


@pytest.mark.parametrize("seed", SEEDS)
def test_crash_schedule(seed: int, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        published, broker, dropped = run(crash_schedule(seed, tmp_path / OUTBOX_FILE), limit_s=60.0)
    drops = Tally(r.fields["id"] for r in events_of(caplog, "finding_dropped"))   # type: ignore[attr-defined]
    assert sum(drops.values()) == dropped
    arrived: dict[str, list[int]] = {h: [] for h in HOSTS}
    for _, value, _ in broker.topic:
        f = Finding.decode(value)
        arrived[f.where["host"]].append(int(f.last_seen - T0))
    for host in HOSTS:
        where, seq = f"seed {seed} host {host}", arrived[host]
        assert seq == sorted(seq), f"{where}: out of order {seq} (published {published[host]})"
        missing = [m for m in published[host] if m not in set(seq)]
        assert len(missing) <= drops[fid(host)], f"{where}: lost {missing} across crashes"
