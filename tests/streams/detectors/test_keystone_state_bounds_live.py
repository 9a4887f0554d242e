"""The Keystone host state on the real path: a real worker, its ``detector-state`` changelog on a real broker,
a restart restoring from it (``test_keystone_state_bounds.py`` has the detector-level cases).

Before: (1) 6,000 access keys of one host (a scanner trying keys, rotating credentials) made a 1.9 MB host state;
its changelog write raised MessageSizeTooLargeError in Faust's producer buffer, which crashed the worker (every
detector with it), and the records after it were never processed. (2) 9,100 rounds of 1e12 validations in one
pane were taken (each within the per-round bound): the pane's count passed 2**53, and the restart refused the
host's state (``state_restore_failed``, ``reason="unreadable"``): it started afresh."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from opsloop.records import Metric, metric
from opsloop.streams.agents.stateful import STATE_TABLE
from opsloop.topics import Topic
from opsloop.wire import encode_batch
from tests.e2e.pipeline import start_worker
from tests.helpers import create_topics, read_topic, scrape_metric, unique, wait_until, write_config
from tests.streams.agents.test_integration import detectors_config

pytestmark = pytest.mark.integration

RECORD_LIMIT = 1_000_000   # Faust's producer_max_request_size
STATE_MAX = 2 ** 53


def _cred(host: str, key: str, ts: float, validations: float = 3) -> Metric:
    return metric("s3_frontend_credential", {"keystone_validations": validations, "requests": 3},
                  {"host": host, "access_key": key}, ts)


class Run:
    """A worker's config under a topic prefix of its own (no other test's records, nor this module's other
    test's, reach its worker), its metrics port and changelog."""

    def __init__(self, stack: Any, tmp: Path) -> None:
        self.stack, self.tmp, self.bootstrap = stack, tmp, stack.kafka_bootstrap
        self.config, self.doc = detectors_config(tmp, stack)
        self.prefix = unique("ks").replace("-", "") + "."
        self.doc["kafka"]["topic_prefix"] = self.prefix
        write_config(self.config, self.doc)
        self.port = self.doc["stream"]["metrics_port"]
        self.group = self.prefix + self.doc["stream"]["app_id"]   # the Faust app id, the changelog's prefix
        self.topic = self.prefix + Topic.KEYSTONE.value
        create_topics(self.bootstrap, self.topic, partitions=self.doc["kafka"]["partitions"])

    def start(self) -> Any:
        return start_worker(self.tmp, self.config, self.doc, self.stack)

    def send(self, records: list[tuple[str, list[Metric]]]) -> None:
        _send(self.bootstrap, self.topic, records)

    def window(self, host: str) -> float | None:
        return scrape_metric(self.port, "opsloop_keystone_window_validations", {"host": host})

    def state(self, host: str) -> tuple[dict[str, Any] | None, int]:
        """The host's latest state in the changelog, and its record's size."""
        latest, size = None, 0
        key = orjson.dumps(f"keystone-detector|{host}")
        for r in read_topic(self.bootstrap, f"{self.group}-{STATE_TABLE}-changelog"):
            if r.key == key:
                latest, size = (orjson.loads(r.value) if r.value else None), len(r.value or b"")
        return latest, size

    def unreadable(self) -> float | None:
        return scrape_metric(self.port, "opsloop_stream_state_dropped_total",
                             {"handler": "keystone-detector", "reason": "unreadable"})

    def restart_and_restore(self, worker: Any) -> Any:
        """Stop ``worker`` once its offsets are committed (no replay recounts what the state should bring back),
        start it again and feed it a round of another host: its first batch restores the table."""
        wait_until(lambda: self.committed(), timeout=60, what="the rounds' offsets committed")
        worker.stop()
        worker = self.start()
        probe = unique("rgw-probe")
        self.send([(probe, [_cred(probe, "AKIAPROBE", time.time() - 60, 5)])])
        wait_until(lambda: self.window(probe) == 5, timeout=90, what="a batch after the restart")
        return worker

    def committed(self) -> bool:
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False)
        try:
            tps = [TopicPartition(self.topic, p) for p in consumer.partitions_for_topic(self.topic) or ()]
            ends = consumer.end_offsets(tps)
            return bool(tps) and all(ends[tp] == 0 or (consumer.committed(tp) or 0) >= ends[tp] for tp in tps)
        finally:
            consumer.close()


def _send(bootstrap: str, topic: str, records: list[tuple[str, list[Metric]]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=2 ** 20)
    try:
        for key, batch in records:
            producer.send(topic, key=key.encode(), value=encode_batch(batch))
        producer.flush()
    finally:
        producer.close()


def test_a_host_with_thousands_of_access_keys_keeps_the_worker_up_and_restores(stack, tmp_path: Path) -> None:
    run = Run(stack, tmp_path)
    host, good = unique("rgw"), unique("rgw-good")
    t0 = time.time() - 3600
    t0 -= t0 % 60
    worker = run.start()
    try:
        run.send([(host, [_cred(host, f"AK{r:02d}{i:05d}" + "k" * 240, t0 + 60 * r) for i in range(1500)])
                  for r in range(4)])
        run.send([(host, [_cred(good, "AKIAGOOD", t0 + 240, 7)])])   # same partition, after the flood
        wait_until(lambda: run.window(good) == 7, timeout=90, what="the good record after the flood processed")
        assert run.window(host) == 4 * 1500 * 3    # every validation counted
        state, size = wait_until(lambda: (found := run.state(host))[0] and found, timeout=60,
                                 what="the host's state in the changelog (a record over 1 MB crashed the worker)")
        assert size < RECORD_LIMIT // 2, size
        assert len(state["last_ts"]) <= 2048
        worker = run.restart_and_restore(worker)
        assert run.window(host) == 4 * 1500 * 3    # the host's window restored
        assert not run.unreadable()
    finally:
        worker.stop()


def test_validation_counts_beyond_a_restore_are_refused_and_the_host_restores(stack, tmp_path: Path) -> None:
    run = Run(stack, tmp_path)
    host, sentinel = unique("rgw-hot"), unique("rgw-sentinel")
    t0 = time.time() - 3600
    t0 -= t0 % 60
    taken = STATE_MAX // 10 ** 12   # rounds of 1e12 one pane can hold
    worker = run.start()
    try:
        rounds = [_cred(host, "AKIAHOT", t0 + i * 0.005, 1e12) for i in range(9100)]
        run.send([(host, rounds[i:i + 2000]) for i in range(0, len(rounds), 2000)])
        run.send([(host, [_cred(sentinel, "AKIA1", t0 + 50, 1)])])   # same partition, after them
        wait_until(lambda: run.window(sentinel) == 1, timeout=90, what="the rounds processed")
        counted = run.window(host)
        refused = scrape_metric(run.port, "opsloop_detector_samples_rejected_total", {"detector": "keystone-detector"})
        wait_until(lambda: (run.state(host)[0] or {}).get("last_ts"), timeout=60,
                   what="the host's state in the changelog")
        worker = run.restart_and_restore(worker)
        assert run.window(host) == counted   # restored, not refused
        assert not run.unreadable()
        assert (counted, refused) == (taken * 10 ** 12, 9100 - taken)   # up to 2**53, the rest refused
    finally:
        worker.stop()
