"""The broker hangs (SIGSTOP: a GC pause, a stuck disk) or dies in the middle of a send.

The publisher used to send on the collection loop's thread and wait for the acks, so a send caught
by a broker kill blocked the loop for the whole send timeout (a soak run saw an IPMI collector take
21 s for a 2 s round: 11 rounds never collected). Now the loop hands rounds to a sender thread: it
keeps collecting at its interval while the broker is frozen, the rounds collected meanwhile are
spooled durably, and when the broker is back every round arrives, in order per key, including the
one that was in flight (which goes back into the spool ahead of the later rounds when its send fails).

The broker is the suite's real Kafka, frozen by PID with SIGSTOP and thawed with SIGCONT in a
``finally``. The collector runtime (real kafka-python producer, real spool) runs in-process.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY

from opsloop.collect import Round
from opsloop import atomic_file
from opsloop.collect.publisher import Publisher
from opsloop.collect.runner import run_loop
from opsloop.records import metric
from tests.faults.test_spool_disk_full import FullDisk
from tests.helpers import read_topic, unique, wait_until

pytestmark = pytest.mark.integration

ROUNDS_WHILE_FROZEN = 6


class SequenceCollector:
    """One series (one key): seq 0, 1, 2, ... one per round."""

    def __init__(self, host: str) -> None:
        self.name = host
        self.host = host
        self.seq = 0

    def collect(self) -> Round:
        m = metric("lb_fault_seq", {"seq": self.seq}, {"host": self.host}, timestamp=1_700_000_000.0 + self.seq)
        self.seq += 1
        return Round([m])


@contextmanager
def frozen(stack) -> Iterator[None]:
    rec = stack.component("kafka").read_pid()
    assert rec is not None, "the suite's Kafka has no PID file"
    pid = rec[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def delivered(stack, host: str) -> list[int]:
    """The seqs of ``host`` on the topic, first arrivals only (a re-sent record may repeat: at-least-once)."""
    seen: list[int] = []
    for rec in read_topic(stack.kafka_bootstrap, "telemetry.lb", timeout_s=30):
        if rec.key != host.encode():
            continue
        for m in orjson.loads(rec.value)["metrics"]:
            if m["fields"]["seq"] not in seen:
                seen.append(m["fields"]["seq"])
    return seen


def sends_failed(name: str) -> float:
    return REGISTRY.get_sample_value("opsloop_collector_send_failures_total", {"collector": name}) or 0.0


def test_the_loop_keeps_collecting_while_the_broker_is_frozen_and_nothing_is_lost(stack, tmp_path: Path) -> None:
    host = unique("frozen")
    collector = SequenceCollector(host)
    # A send timeout far longer than the test: with the old synchronous send the first round after the
    # freeze held the loop for all of it, and the rounds below could not all be collected while frozen.
    publisher = Publisher(stack.kafka_bootstrap, tmp_path / "spool", collector=host, send_timeout_s=300.0)
    try:
        run_loop(collector, interval_s=0.05, publisher=publisher, max_rounds=1)
        assert publisher.flush(60), "the first round was not acknowledged by the running broker"
        with frozen(stack):
            loop = threading.Thread(target=run_loop, args=(collector,), daemon=True,
                                    kwargs=dict(interval_s=0.2, publisher=publisher, max_rounds=ROUNDS_WHILE_FROZEN))
            loop.start()
            loop.join(timeout=60)
            assert not loop.is_alive(), "the collection loop waited for the frozen broker"
            assert collector.seq == 1 + ROUNDS_WHILE_FROZEN
            # the first round after the freeze is in flight; every later one is on disk, durably
            assert publisher.spool.count_records() == ROUNDS_WHILE_FROZEN - 1
        wait_until(lambda: publisher.flush(5), timeout=120, what="the queued rounds delivered after the thaw")
        assert publisher.spool.empty()
    finally:
        publisher.close(timeout_s=0)
    assert delivered(stack, host) == list(range(1 + ROUNDS_WHILE_FROZEN))


def test_a_send_that_fails_in_flight_is_replayed_ahead_of_the_rounds_spooled_behind_it(stack, tmp_path: Path) -> None:
    host = unique("inflight")
    collector = SequenceCollector(host)
    publisher = Publisher(stack.kafka_bootstrap, tmp_path / "spool", collector=host, send_timeout_s=2.0)
    try:
        publisher.publish_metrics(collector.collect().metrics)            # seq 0, acknowledged
        assert publisher.flush(60)
        with frozen(stack):
            for _ in range(4):                                           # seq 1 in flight, 2..4 spooled
                publisher.publish_metrics(collector.collect().metrics)
            assert publisher.spool.count_records() == 3
            wait_until(lambda: sends_failed(host) >= 1, timeout=60, interval=0.1, what="the in-flight send to fail")
            # the failed round went back to the spool under its own sequence number: first in line
            wait_until(lambda: publisher.spool.count_records() == 4, timeout=30, interval=0.1,
                       what="the failed round spooled")
            path, first = publisher.spool.oldest() or (None, [])
            assert [m["fields"]["seq"] for r in first for m in orjson.loads(r.value)["metrics"]] == [1]
        # the first attempt after the thaw may fail again (at-least-once, counted): wait for the replay
        wait_until(lambda: publisher.flush(5), timeout=120, what="the spool replayed")
    finally:
        publisher.close(timeout_s=0)
    assert delivered(stack, host) == [0, 1, 2, 3, 4]


def test_rounds_the_spool_disk_refuses_wait_in_memory_in_order(stack, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    host = unique("fulldisk")
    collector = SequenceCollector(host)
    publisher = Publisher(stack.kafka_bootstrap, tmp_path / "spool", collector=host, send_timeout_s=300.0)
    lost = lambda: REGISTRY.get_sample_value("opsloop_collector_lost_records_total",  # noqa: E731
                                             {"collector": host}) or 0.0
    try:
        publisher.publish_metrics(collector.collect().metrics)
        assert publisher.flush(60)
        monkeypatch.setattr(atomic_file, "open", FullDisk(), raising=False)
        with frozen(stack):
            for _ in range(4):                       # seq 1 in flight; the disk refuses 2..4
                publisher.publish_metrics(collector.collect().metrics)
            assert publisher.spool.empty()
            assert publisher.stats()["memory_records"] >= 3
        wait_until(lambda: publisher.flush(5), timeout=120, what="the rounds held in memory delivered")
    finally:
        publisher.close(timeout_s=0)
    assert lost() == 0
    assert delivered(stack, host) == [0, 1, 2, 3, 4]
