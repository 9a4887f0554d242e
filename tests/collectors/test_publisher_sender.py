"""The publisher's sender thread against an in-process broker: seeded schedules of sends that succeed,
fail (flush raises, or some futures raise) or hang until released, interleaved with publish() calls and
a spool disk that refuses writes now and then.

What must hold on every schedule: nothing is lost unless counted (spool drops, memory-bound losses); per
key the first arrivals are in publish order (a record may repeat: at-least-once); flush() comes true once
sends succeed; publish() never waits for the broker (a hung send is released by this thread, which could
not do it if publish() waited: the fake counts the hangs that ran into their own timeout); and close()
leaves every unsent record in the spool, where a new publisher on the same directory replays it.

The targeted tests below reproduce the bugs this file found, one schedule each.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from opsloop.collect import publisher as publisher_module
from opsloop import atomic_file
from opsloop.collect.publisher import Publisher
from opsloop.collect.spool import Record, Spool
from tests.faults.test_spool_disk_full import FullDisk
from tests.helpers import wait_until

KEYS = ["a", "b", "c", "d"]
HANG_TIMEOUT_S = 10.0   # the fake's hung flush gives up after this (a failure of the test, see `timeouts`)


class FakeFuture:
    def __init__(self) -> None:
        self.error: Exception | None = None
        self.done = False

    def get(self, timeout: float | None = None) -> None:
        if self.error is not None:
            raise self.error
        if not self.done:
            raise TimeoutError("not acknowledged")


class FakeBroker:
    """What the producers deliver, and how the next flush behaves: ``ok``, ``fail`` (the flush raises,
    nothing delivered), ``raise`` (the flush raises; a random per-key prefix may have reached the broker
    anyway: at-least-once), ``futures`` (per key a suffix of the
    records fails, as one partition's batches do) or ``hang`` (the flush waits for ``release()``)."""

    def __init__(self, seed: int) -> None:
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.mode = "ok"
        self.gate = threading.Event()
        self.gate.set()
        self.hanging = threading.Event()    # a flush waits at the gate
        self.delivered: list[tuple[str, int]] = []
        self.timeouts = 0                   # hung flushes nobody released

    def set_mode(self, mode: str) -> None:
        with self.lock:
            self.mode = mode
            if mode == "hang":
                self.gate.clear()
            else:
                self.gate.set()

    def producer(self) -> "FakeProducer":
        return FakeProducer(self)

    def settle(self, pending: list[tuple[bytes, bytes, FakeFuture]], timeout: float | None) -> None:
        while True:
            with self.lock:
                mode = self.mode
            if mode != "hang":
                break
            self.hanging.set()
            if not self.gate.wait(HANG_TIMEOUT_S if timeout is None else min(timeout, HANG_TIMEOUT_S)):
                with self.lock:
                    self.timeouts += 1
                raise TimeoutError("flush timed out (the broker hangs)")
        with self.lock:
            by_key: dict[bytes, list[tuple[bytes, FakeFuture]]] = {}
            for key, value, fut in pending:
                by_key.setdefault(key, []).append((value, fut))
            cut = {k: (len(v) if mode == "ok" else 0 if mode == "fail" else self.rng.randint(0, len(v))) for k, v in by_key.items()}
            seen: dict[bytes, int] = {}
            for key, value, fut in pending:   # arrival order: the send order
                i = seen.get(key, 0)
                seen[key] = i + 1
                if i < cut[key]:
                    d = orjson.loads(value)
                    self.delivered.append((d["k"], d["n"]))
                    fut.done = True
                else:
                    fut.error = RuntimeError("delivery failed")
        if mode in ("raise", "fail"):
            raise RuntimeError("the broker went away")


class FakeProducer:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.pending: list[tuple[bytes, bytes, FakeFuture]] = []
        self.closed = False

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None) -> FakeFuture:
        assert not self.closed, "send on a closed producer"
        assert key is not None and value is not None
        fut = FakeFuture()
        self.pending.append((key, value, fut))
        return fut

    def flush(self, timeout: float | None = None) -> None:
        pending, self.pending = self.pending, []
        self.broker.settle(pending, timeout)

    def close(self, timeout: float | None = None) -> None:
        self.closed = True
        self.pending = []   # close(timeout=0) aborts what was not flushed


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    """Short back-off (the schedules fail often), and the spool's disk under the test's control."""
    monkeypatch.setattr(publisher_module, "MIN_BACKOFF_S", 0.001)
    monkeypatch.setattr(publisher_module, "MAX_BACKOFF_S", 0.004)
    disk = FullDisk()
    disk.full = False
    monkeypatch.setattr(atomic_file, "open", disk, raising=False)
    return disk


def use_broker(monkeypatch: pytest.MonkeyPatch, broker: FakeBroker) -> None:
    def get_producer(self: Publisher) -> Any:
        if self._producer is None:
            self._producer = broker.producer()
        return self._producer
    monkeypatch.setattr(Publisher, "_get_producer", get_producer)


def record(key: str, n: int, pad: int = 0) -> Record:
    return Record("telemetry.lb", key, orjson.dumps({"k": key, "n": n, "pad": "x" * pad}))


def lost(name: str) -> float:
    return REGISTRY.get_sample_value("opsloop_collector_lost_records_total", {"collector": name}) or 0.0


class Schedule:
    """The test thread's side: rounds published, in order, one counter per key."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.published: list[tuple[str, int]] = []
        self.next_n = {k: 0 for k in KEYS}

    def round(self, pad: int) -> list[Record]:
        out = []
        for key in self.rng.sample(KEYS, self.rng.randint(1, len(KEYS))):
            for _ in range(self.rng.choice([1, 1, 2])):    # a large group travels as several records of a key
                n = self.next_n[key]
                self.next_n[key] += 1
                self.published.append((key, n))
                out.append(record(key, n, pad))
        return out

    def run(self, pub: Publisher, broker: FakeBroker, disk: FullDisk, steps: int, pad: int) -> None:
        rng = self.rng
        for _ in range(steps):
            a = rng.random()
            if a < 0.45:
                pub.publish(self.round(pad))
            elif a < 0.6:
                broker.set_mode(rng.choice(["ok", "ok", "fail", "raise", "futures", "hang"]))
            elif a < 0.7:
                disk.full = rng.random() < 0.5
            elif a < 0.8:
                broker.hanging.wait(0.02)    # let the sender reach a hung send (or not)
            elif a < 0.87:
                pub.flush(rng.choice([0.0, 0.005]))
            elif a < 0.9:
                damage_oldest_segment(pub.spool.dir)
            else:
                assert pub.stats()["memory_records"] >= 0
        broker.hanging.clear()


def damage_oldest_segment(spool_dir: Path) -> None:
    """The disk garbles the oldest segment, line for line (so the lines quarantined count the records
    lost), swapped in whole: a reader sees the old file or the new one."""
    segs = sorted(spool_dir.glob("*.jsonl"))
    if not segs:
        return
    try:
        n = len(segs[0].read_bytes().splitlines())
    except FileNotFoundError:   # sent meanwhile
        return
    tmp = spool_dir / "damage.part"
    tmp.write_bytes(b"\x00 garbled\n" * n)
    try:
        os.replace(tmp, segs[0])
    except FileNotFoundError:
        tmp.unlink()


def check(published: list[tuple[str, int]], delivered: list[tuple[str, int]], counted_losses: float) -> None:
    first: dict[str, list[int]] = {k: [] for k in KEYS}
    seen: set[tuple[str, int]] = set()
    for kn in delivered:
        if kn not in seen:
            seen.add(kn)
            first[kn[0]].append(kn[1])
    for key, ns in first.items():
        assert ns == sorted(ns), f"key {key}: first arrivals out of publish order: {ns}"
    missing = [kn for kn in published if kn not in seen]
    assert len(missing) <= counted_losses, f"{len(missing)} records missing, {counted_losses} counted: {missing[:10]}"
    assert not (seen - set(published)), "delivered records that were never published"


# (spool bound in bytes, memory bound in bytes, padding per record): unbounded, then both bounds biting
SHAPES = [(1 << 30, 1 << 30, 0), (1 << 30, 1 << 30, 0), (2500, 1 << 30, 100), (1 << 30, 3000, 100)]


@pytest.mark.parametrize("seed", range(24))
def test_random_schedules_lose_nothing_uncounted_and_keep_order_per_key(
        seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: FullDisk) -> None:
    spool_max, memory_max, pad = SHAPES[seed % len(SHAPES)]
    monkeypatch.setattr(publisher_module, "MEMORY_MAX_BYTES", memory_max)
    broker = FakeBroker(seed)
    use_broker(monkeypatch, broker)
    name = f"sender-{uuid.uuid4().hex[:8]}"
    sched = Schedule(seed)
    pub = Publisher("127.0.0.1:9", tmp_path, collector=name, spool_max_bytes=spool_max, send_timeout_s=5.0)
    try:
        sched.run(pub, broker, fast, steps=150, pad=pad)
        fast.full = False
        broker.set_mode("ok")
        wait_until(lambda: pub.flush(0.05), timeout=20, interval=0.005, what="flush() true once sends succeed")
        assert pub.spool.empty() and pub.stats()["memory_records"] == 0
        assert broker.timeouts == 0, "a hung send was not released: publish() waited for the broker"
        check(sched.published, broker.delivered,
              lost(name) + pub.spool.dropped_records + pub.spool.quarantined_lines)
        if spool_max == memory_max == 1 << 30:
            assert lost(name) == 0 and pub.spool.dropped_records == 0
    finally:
        broker.set_mode("ok")
        pub.close(timeout_s=0)


@pytest.mark.parametrize("seed", range(16))
def test_close_leaves_every_unsent_record_in_the_spool_for_the_next_start(
        seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: FullDisk) -> None:
    broker = FakeBroker(1000 + seed)
    use_broker(monkeypatch, broker)
    name = f"close-{uuid.uuid4().hex[:8]}"
    sched = Schedule(1000 + seed)
    pub = Publisher("127.0.0.1:9", tmp_path, collector=name, send_timeout_s=0.5)
    try:
        sched.run(pub, broker, fast, steps=100, pad=0)
        broker.set_mode(sched.rng.choice(["raise", "futures", "hang"]))   # the broker is gone at the stop
        fast.full = False
        pub.close(timeout_s=0)
    finally:
        broker.set_mode("ok")
    assert not pub._sender.is_alive() and pub.stats()["memory_records"] == 0
    assert lost(name) == 0
    again = Publisher("127.0.0.1:9", tmp_path, collector=name, send_timeout_s=5.0)
    try:
        wait_until(lambda: again.flush(0.05), timeout=20, interval=0.005, what="the spool replayed")
        assert again.spool.empty()
    finally:
        again.close(timeout_s=0)
    check(sched.published, broker.delivered, pub.spool.quarantined_lines + again.spool.quarantined_lines)


# ------------------------------------------------------------------------------------------- targeted
def backoff_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed send backs off until the test ends it (end_backoff): the schedule moves the sender on."""
    monkeypatch.setattr(publisher_module, "MIN_BACKOFF_S", 3600.0)
    monkeypatch.setattr(publisher_module, "MAX_BACKOFF_S", 3600.0)


def end_backoff(pub: Publisher) -> None:
    with pub._cv:
        pub._retry_at = 0.0
        pub._cv.notify_all()


def test_a_round_held_in_memory_is_not_overtaken_when_the_oldest_segment_vanishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: FullDisk) -> None:
    """The sender compared the memory queue's head with the spool's oldest segment, then read "the
    oldest segment" again: one that had vanished meanwhile (quarantined whole, or dropped by the bound)
    let a later segment go ahead of the round held in memory."""
    backoff_for_good(monkeypatch)
    broker = FakeBroker(0)
    use_broker(monkeypatch, broker)
    pub = Publisher("127.0.0.1:9", tmp_path, collector=f"vanish-{uuid.uuid4().hex[:8]}", send_timeout_s=5.0)
    try:
        broker.set_mode("hang")
        pub.publish([record("a", 0)])                           # seq 0: in flight, hung
        assert broker.hanging.wait(10)
        fast.full = True
        pub.publish([record("a", 1)])                           # seq 1: the disk refuses it, held in memory
        fast.full = False
        pub.publish([record("a", 2)])                           # seq 2: spooled
        broker.set_mode("fail")                                 # seq 0 fails: spooled under 0, back-off
        wait_until(lambda: pub.spool.first_seq() == 0, timeout=10, interval=0.005, what="round 0 spooled")
        wait_until(lambda: not pub._busy, timeout=10, interval=0.005, what="the sender backing off")
        (tmp_path / "000000000000.jsonl").write_bytes(b"\x00\x00 damaged\n")   # the disk garbles it
        broker.set_mode("ok")
        end_backoff(pub)
        wait_until(lambda: pub.flush(0.05), timeout=10, interval=0.005, what="everything sent")
    finally:
        pub.close(timeout_s=0)
    assert [n for _, n in broker.delivered] == [1, 2], "the spooled round 2 went ahead of round 1"


def test_spool_totals_that_drift_do_not_spin_the_sender(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        fast: FullDisk) -> None:
    """A segment renamed into place whose directory fsync failed was not counted; replayed later it was
    subtracted: the spool said 'not empty' with no segment left, and the sender looped without a pause
    (oldest() None, no back-off) while flush() never came true."""
    broker = FakeBroker(0)
    use_broker(monkeypatch, broker)
    pub = Publisher("127.0.0.1:9", tmp_path, collector=f"drift-{uuid.uuid4().hex[:8]}", send_timeout_s=5.0)
    real_fsync_dir = atomic_file.sync_dir
    fails = [1]

    def fsync_dir_once(directory: Path) -> None:
        if fails:
            fails.pop()
            raise OSError(errno.EIO, "Input/output error")
        real_fsync_dir(directory)

    oldest_calls = [0]
    real_oldest = Spool.oldest

    def counting_oldest(self: Spool) -> Any:
        oldest_calls[0] += 1
        return real_oldest(self)

    monkeypatch.setattr(Spool, "oldest", counting_oldest)
    try:
        broker.set_mode("hang")
        pub.publish([record("a", 0)])                   # in flight
        assert broker.hanging.wait(10)
        monkeypatch.setattr(atomic_file, "sync_dir", fsync_dir_once)
        pub.publish([record("a", 1)])                   # renamed into place, then the fsync fails: held too
        broker.set_mode("ok")
        wait_until(lambda: pub.flush(0.05), timeout=10, interval=0.005, what="rounds 0 and 1 sent")
        pub.publish([record("a", 2)])                   # the uncounted segment 1 is replayed before it
        wait_until(lambda: pub.flush(0.05), timeout=10, interval=0.005, what="flush() true (the sender spins)")
        calls = oldest_calls[0]
        threading.Event().wait(0.2)
        assert oldest_calls[0] - calls < 5, "the sender spins on an empty spool"
    finally:
        pub.close(timeout_s=0)
    first = []
    for _, n in broker.delivered:
        if n not in first:
            first.append(n)
    assert first == [0, 1, 2]


def test_an_unreadable_segment_is_quarantined_and_does_not_hold_the_spool_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: FullDisk) -> None:
    """A segment the disk cannot read (EIO) is quarantined; counting its lines read it again and raised,
    so the sender failed on it forever (in back-off) and no later round was ever sent."""
    backoff_for_good(monkeypatch)
    broker = FakeBroker(0)
    use_broker(monkeypatch, broker)
    pub = Publisher("127.0.0.1:9", tmp_path, collector=f"eio-{uuid.uuid4().hex[:8]}", send_timeout_s=5.0)
    bad = tmp_path / "000000000000.jsonl"
    real_open = Path.open

    def eio_open(self: Path, *a: Any, **kw: Any) -> Any:
        if self == bad:
            raise OSError(errno.EIO, "Input/output error")
        return real_open(self, *a, **kw)

    try:
        broker.set_mode("fail")
        pub.publish([record("a", 0)])                   # fails: spooled under seq 0, back-off
        wait_until(lambda: bad.exists() and not pub._busy, timeout=10, interval=0.005, what="round 0 spooled")
        monkeypatch.setattr(Path, "open", eio_open)     # the disk can no longer read it
        pub.publish([record("a", 1)])                   # in back-off: spooled behind it
        broker.set_mode("ok")
        end_backoff(pub)
        wait_until(lambda: pub.flush(0.05), timeout=10, interval=0.005, what="the round behind the bad segment sent")
        assert pub.spool.empty() and pub.spool.size_bytes() == 0
    finally:
        pub.close(timeout_s=0)
    assert broker.delivered == [("a", 1)]
    assert (tmp_path / "quarantine" / "000000000000.jsonl.bad").exists()
