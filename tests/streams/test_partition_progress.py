"""Each held source partition's committed offset and uncommitted records, from real workers on a real broker.

What was not seen before (streams/runtime/progress.py): a worker that holds a partition and processes nothing
exported nothing about it (the batch metrics are set by batches), and a worker that lost a partition at a
rebalance went on exporting its batch lag. Here: a worker whose agent stops for good (its after-batch hook
hangs: tests/streams/stuck_worker.py) goes on exporting the partition's committed offset, unmoved, under more and
more uncommitted records, as the broker has them; and a second `opsloop stream worker` joining takes the series
of the partitions it gets away from the first.

Old code: both tests fail (no such series).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from opsloop.records import metric
from opsloop.stack.process import ManagedProcess
from opsloop.stack import free_port
from opsloop.topics import Topic
from opsloop.wire import encode_batch
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import REPO, metric_samples, metrics_up, samples_named, unique, wait_until, write_config

pytestmark = pytest.mark.integration

INTERVAL_S = 0.5   # stream.progress_interval_s of the workers here
COMMITTED, UNCOMMITTED = "opsloop_stream_committed_offset", "opsloop_stream_uncommitted_records"
LAG, ASSIGNED = "opsloop_stream_consumer_lag", "opsloop_stream_partition_assigned"
SOURCES = {t.value for t in (Topic.LB, Topic.IPMI, Topic.IPTABLES, Topic.KEYSTONE, Topic.NETPERF)}

Series = dict[tuple[str, int], float]


def series(port: int, name: str) -> Series:
    return {(labels["topic"], int(labels["partition"])): v for labels, v in samples_named(metric_samples(port), name)}


def group_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets as the broker has them (the coordinator's view, no member joins)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        found = admin.list_group_offsets({group: None})[group]   # kafka-python 3: list_consumer_group_offsets before
        return {(tp.topic, tp.partition): m.offset for tp, m in found.items() if m.offset >= 0}
    finally:
        admin.close()


def records(n: int) -> list[bytes]:
    rng, t0 = random.Random(3), time.time() - 3600
    return [encode_batch([metric("ipmi_power", {"watts": 150.0 + rng.random()}, {"host": "h-1"}, t0 + 60 * i)])
            for i in range(n)]


def send(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> int:
    """Produce ``values`` to one partition; the offset after the last (the partition's new highwater)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        sent = [producer.send(topic, value=v, partition=partition).get(timeout=30) for v in values]
    finally:
        producer.close()
    return sent[-1].offset + 1


def test_a_stuck_agent_shows_a_committed_offset_that_does_not_move(stack: Any, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    topic, group, port = unique("t-progress"), unique("t-progress-app"), free_port()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    config = write_config(tmp_path / "opsloop.yaml", {
        "kafka": {"bootstrap_servers": bootstrap, "partitions": 1},
        "stream": {"app_id": group, "data_dir": str(tmp_path / "streams"), "metrics_port": port,
                   "web_port": free_port(), "batch_within_s": 0.2, "progress_interval_s": INTERVAL_S}})
    block = tmp_path / "block"
    worker = ManagedProcess(name="stuck-worker", workdir=tmp_path / "worker", ready=lambda: metrics_up(port),
                            argv=[sys.executable, "-m", "tests.streams.stuck_worker", "--config", str(config),
                                  "--topic", topic, "--block-file", str(block)],
                            env={"PYTHONPATH": str(REPO)}, ready_timeout_s=90)
    tp = (topic, 0)
    worker.start()
    try:
        # held, nothing in it, never committed: the log start, nothing uncommitted
        wait_until(lambda: (series(port, COMMITTED).get(tp), series(port, UNCOMMITTED).get(tp)) == (0, 0),
                   timeout=90, what="the empty partition's progress exported")
        end = send(bootstrap, topic, records(5))
        wait_until(lambda: (series(port, COMMITTED).get(tp), series(port, UNCOMMITTED).get(tp)) == (end, 0),
                   timeout=60, what=f"committed offset {end}, nothing uncommitted")
        assert group_offsets(bootstrap, group).get(tp) == end   # the broker's own view

        block.touch()   # the agent hangs after its next batch: never acked, never committed
        stuck_at = end
        end = send(bootstrap, topic, records(4))
        wait_until(lambda: series(port, UNCOMMITTED).get(tp) == end - stuck_at, timeout=60,
                   what=f"{end - stuck_at} records uncommitted")
        end = send(bootstrap, topic, records(2))   # more keep coming: the gauge follows, the commit does not
        wait_until(lambda: series(port, UNCOMMITTED).get(tp) == end - stuck_at, timeout=60,
                   what=f"{end - stuck_at} records uncommitted")
        assert series(port, COMMITTED).get(tp) == stuck_at == group_offsets(bootstrap, group).get(tp)
        # what the batch metrics show meanwhile: the hung batch's lag, frozen below what waits (they could not tell)
        assert (series(port, LAG).get(tp) or 0) < end - stuck_at
    finally:
        worker.stop()


def second_worker(tmp: Path, doc: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Another worker of the same group: own ports and data dir."""
    other = {**doc, "stream": {**doc["stream"], "metrics_port": free_port(), "web_port": free_port(),
                               "data_dir": str(tmp / "streams-b")}}
    (tmp / "b").mkdir()
    return write_config(tmp / "b" / "opsloop.yaml", other), other


def held_sources(port: int) -> set[tuple[str, int]]:
    return {tp for tp in series(port, ASSIGNED) if tp[0] in SOURCES}


def test_a_joining_worker_takes_the_series_of_the_partitions_it_gets(stack: Any, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    config, doc = pipeline_config(tmp_path, stack)
    doc["stream"]["progress_interval_s"] = INTERVAL_S
    write_config(config, doc)
    group, port_a = doc["stream"]["app_id"], doc["stream"]["metrics_port"]
    a = start_worker(tmp_path, config, doc, stack)
    b = None
    try:
        # A alone: every source partition (20: 5 topics x 4), each with its progress
        everything = wait_until(lambda: (held := held_sources(port_a)) and len(held) == 20
                                and set(series(port_a, COMMITTED)) == held and held, timeout=120,
                                what="worker A exporting every source partition")
        ends = {p: send(bootstrap, Topic.LB.value, records(2), partition=p) for p in range(4)}
        wait_until(lambda: all(series(port_a, COMMITTED).get((Topic.LB.value, p)) == end for p, end in ends.items())
                   and all((Topic.LB.value, p) in series(port_a, LAG) for p in ends), timeout=60,
                   what="telemetry.lb handled and committed by A")

        config_b, doc_b = second_worker(tmp_path, doc)
        port_b = doc_b["stream"]["metrics_port"]
        b = start_worker(tmp_path / "b", config_b, doc_b, stack)

        def split() -> bool:
            held_a, held_b = held_sources(port_a), held_sources(port_b)
            return (bool(held_a) and bool(held_b) and not held_a & held_b and held_a | held_b == everything
                    and set(series(port_a, COMMITTED)) == held_a == set(series(port_a, UNCOMMITTED))
                    and set(series(port_b, COMMITTED)) == held_b == set(series(port_b, UNCOMMITTED)))
        wait_until(split, timeout=120, what="the partitions split between A and B, each exporting only its own")
        held_a = held_sources(port_a)
        lag_a = {tp for tp in series(port_a, LAG) if tp[0] in SOURCES}
        assert lag_a <= held_a, f"A still shows the batch lag of partitions it lost: {sorted(lag_a - held_a)}"
        # both agree with the broker on what was committed (B found A's commits of the partitions it took)
        on_broker = group_offsets(bootstrap, group)
        for port, held in ((port_a, held_a), (port_b, held_sources(port_b))):
            shown = series(port, COMMITTED)
            for tp in held:
                if tp in on_broker:
                    assert shown[tp] == on_broker[tp], (tp, shown[tp], on_broker[tp])
        for p, end in ends.items():
            owner = port_a if (Topic.LB.value, p) in held_a else port_b
            assert series(owner, COMMITTED)[(Topic.LB.value, p)] == end
            assert series(owner, UNCOMMITTED)[(Topic.LB.value, p)] == 0
    finally:
        if b is not None:
            b.stop()
        a.stop()
