"""A power generation compared whole by two stream workers on the test stack's Kafka: the same findings as one.

Four servers of one generation whose host names land on four different partitions, one of them drawing far
above the others, sent as the IPMI collector publishes a round (``records_for``: one record per topic and
key, the key from ``opsloop.topics.series_key``). Two consumer groups read the same records: one worker alone
(the reference) and two workers sharing the partitions. With ``min_generation_size`` 4 no worker holding
fewer than all four partitions could compare the generation while its records were keyed by host: the two
workers then showed the cost findings and never the deviation the single worker found. Keyed by generation,
the generation reaches one worker whole: the union of the two workers' open findings is the single worker's,
each shown by one worker only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from opsloop.collect.publisher import records_for
from opsloop.records import Metric, metric
from opsloop.stack import ManagedProcess, Stack
from opsloop.topics import Topic
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import metric_samples, samples_named, unique, wait_until, write_config
from tests.scale.workload import PARTITIONS, keys_covering, partition_of, second_worker_config

pytestmark = pytest.mark.integration

ROUNDS = 5
DEVIATION = "power.generation_deviation"


def _round(hosts: dict[str, float], generation: str, ts: float) -> list[Metric]:
    """One collector round: ``ipmi_power`` with the inventory's metadata tags (collectors/ipmi ``_tags``)."""
    return [metric("ipmi_power", {"watts": w, "watts_avg": w, "sample_period_s": 1},
                   {"host": h, "source": "dcmi", "generation": generation, "role": "ceph-osd", "disks": "12",
                    "raw_capacity_tb": "48"}, ts) for h, w in hosts.items()]


def _open(port: int, hosts: set[str]) -> set[tuple[str, str]]:
    """(detector, host) of the power findings the worker on ``port`` shows open, of ``hosts``."""
    return {(labels["detector"], labels["host"])
            for labels, v in samples_named(metric_samples(port), "opsloop_finding_active")
            if v == 1 and labels.get("host") in hosts and labels["detector"].startswith("power.")}


def _ipmi_partitions(port: int) -> frozenset[int]:
    return frozenset(int(labels["partition"]) for labels, v in samples_named(
        metric_samples(port), "opsloop_stream_partition_assigned", {"topic": Topic.IPMI.value}) if v == 1)


def _group(tmp: Path, stack: Stack, name: str) -> tuple[Path, dict[str, Any]]:
    config, doc = pipeline_config(tmp / name, stack)
    doc["kafka"]["partitions"] = PARTITIONS
    doc["stream"]["app_id"] = unique(f"opsloop-power-{name}")
    doc["streams"] = {"detectors": {"anomaly": {"enabled": False},
                                    "power": {"min_generation_size": 4, "min_samples": 3}}}
    return write_config(config, doc), doc


def test_two_workers_compare_a_generation_whole_as_one_worker_does(stack: Stack, tmp_path: Path) -> None:
    tag = unique("pw")
    a, b, c, x = keys_covering(f"{tag}-stor")   # one server per partition as keyed by host
    fleet = {a: 205.0, b: 200.0, c: 210.0, x: 320.0}   # x: fans at full speed
    assert len({partition_of(h) for h in fleet}) == PARTITIONS
    generation = f"{tag}-gen2"
    for sub in ("one", "two"):
        (tmp_path / sub).mkdir()
    one_config, one_doc = _group(tmp_path, stack, "one")
    two_config, two_doc = _group(tmp_path, stack, "two")
    two_config2, two_doc2 = second_worker_config(tmp_path / "two", two_doc)
    workers: list[ManagedProcess] = []
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
    try:
        workers.append(start_worker(tmp_path / "one", one_config, one_doc, stack))
        workers.append(start_worker(tmp_path / "two", two_config, two_doc, stack))
        workers.append(start_worker(tmp_path / "two" / "w2", two_config2, two_doc2, stack))
        one_port, pair = one_doc["stream"]["metrics_port"], [two_doc["stream"]["metrics_port"],
                                                                two_doc2["stream"]["metrics_port"]]

        def shared() -> bool:
            held = [_ipmi_partitions(p) for p in pair]
            return all(held) and not held[0] & held[1] and held[0] | held[1] == set(range(PARTITIONS))

        wait_until(shared, timeout=120, what="the two workers sharing telemetry.ipmi's partitions")
        wait_until(lambda: _ipmi_partitions(one_port) == set(range(PARTITIONS)), timeout=120,
                   what="the single worker holding every partition")
        assert len(producer.partitions_for(Topic.IPMI.value)) == PARTITIONS
        t0 = 1_795_500_000.0
        for n in range(ROUNDS):
            for r in records_for(_round(fleet, generation, t0 + 60 * n)):   # as the collector publishes a round
                producer.send(r.topic, key=r.key.encode(), value=r.value)
            producer.flush()
        hosts = set(fleet)
        expected = {("power.cost", h) for h in hosts} | {(DEVIATION, x)}
        reference = wait_until(lambda: (f := _open(one_port, hosts)) == expected and f, timeout=90,
                               what=f"the single worker's findings {sorted(expected)}")

        def union() -> set[tuple[str, str]] | None:
            shown = [_open(p, hosts) for p in pair]
            return shown[0] | shown[1] if shown[0] | shown[1] == reference else None

        try:
            wait_until(union, timeout=60, what="the two workers' findings")
        except AssertionError:
            shown = [sorted(_open(p, hosts)) for p in pair]
            raise AssertionError(f"two workers show {shown}, one worker {sorted(reference)}") from None
        shown = [_open(p, hosts) for p in pair]
        assert not shown[0] & shown[1], f"a finding shown by both workers: {sorted(shown[0] & shown[1])}"
        # the whole generation on one worker: the worker holding its key's partition
        assert [bool(s) for s in shown].count(True) == 1
    finally:
        producer.close()
        for w in reversed(workers):
            w.stop()
