"""A changelog partition that ends in a transaction marker does not stall the worker's restart.

faust-streaming 0.15.3 recovers a table partition up to ``end offset - 1`` and waits for a record at
that offset. When the partition ends in a transaction marker (a producer that wrote to it in a
transaction; a killed transactional producer whose transaction the broker aborted) that record never
comes: Faust waits forever and no stream partition is resumed. The recovery watchdog
(streams/runtime/watchdog.py) sees the consumer already past the end with every fetched record
applied, and ends the recovery. Real broker, real worker, supervised as in production; the markers are
written by a real transactional producer (aiokafka).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from kafka import KafkaProducer

from opsloop.stack import Stack
from opsloop.stack.supervisor import Supervisor
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import unique, wait_until, write_config
from tests.scale.workload import PARTITIONS, Telemetry, keys_covering

pytestmark = pytest.mark.integration


async def end_with_markers(bootstrap: str, topic: str, partitions: int) -> None:
    """One committed transaction per partition: a tombstone for a key no detector uses, then the marker."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("marker"))
    await producer.start()
    try:
        async with producer.transaction():
            for p in range(partitions):
                await producer.send_and_wait(topic, key=orjson.dumps("test|marker"), value=None, partition=p)
    finally:
        await producer.stop()


def test_restart_recovers_a_changelog_that_ends_in_a_transaction_marker(stack: Stack, tmp_path: Path) -> None:
    config, doc = pipeline_config(tmp_path, stack)
    doc["stream"]["session_timeout_s"] = 6
    doc.setdefault("streams", {})["detectors"] = {"anomaly": {"enabled": False}}
    write_config(config, doc)
    port = doc["stream"]["metrics_port"]
    changelog = f"{doc['stream']['app_id']}-detector-state-changelog"
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
    tag = unique("wd")
    tel = Telemetry(producer, keys_covering(f"{tag}-lb"), keys_covering(f"{tag}-hv"), time.time() - 3600)
    worker = start_worker(tmp_path, config, doc, stack)
    sup = Supervisor([worker], max_restarts=3, window_s=600, backoff_s=0.5, max_backoff_s=2.0)

    def processed_since(n: int) -> bool:
        sup.check()
        tel.send()
        return not tel.lagging(port, n)
    try:
        first = tel.send()
        wait_until(lambda: processed_since(first), timeout=120, interval=0.5,
                   what="every partition processed (detector state in every changelog partition)")
        asyncio.run(end_with_markers(stack.kafka_bootstrap, changelog, PARTITIONS))

        worker.kill()           # the supervisor restarts it; its recovery reads the changelog to the end
        tel.scale_rates(2.0)
        after = tel.send()
        wait_until(lambda: processed_since(after), timeout=120, interval=0.5,
                   what="every partition processed after the restart")
        log = worker.logfile.read_text(errors="replace")
        skipped = [orjson.loads(line) for line in log.splitlines() if '"recovery_gap_skipped"' in line]
        assert {(e["fields"]["topic"], e["fields"]["partition"]) for e in skipped} == \
            {(changelog, p) for p in range(PARTITIONS)}, skipped
        # what Faust waited for: the marker's offset (never a record); the consumer was already past it
        assert all(e["fields"]["highwater"] == e["fields"]["offset"] + 1 and
                   e["fields"]["position"] == e["fields"]["highwater"] + 1 for e in skipped), skipped
        assert '"recovery_stalled"' not in log        # recovered in place, no watchdog exit
        assert len(sup.events) == 1                    # the one restart after our SIGKILL
    finally:
        producer.close()
        worker.stop()
