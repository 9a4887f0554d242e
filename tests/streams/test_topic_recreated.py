"""A telemetry topic deleted and created again while the worker runs (real worker, real Kafka).

The worker's consumer finds the topic gone at once (its fetches fail, a rebalance drops its partitions:
``Ignoring missing topic``), but sees it back only at its next metadata refresh. Faust's default refresh is
5 min (``consumer_metadata_max_age_ms``): the re-created topic's records, and a collector writes there again
within seconds (auto-created by the broker if nobody else does), were left unread that long, with no error and
no ``OpsloopStreamPartitionStuck`` (no worker held a partition of it to report). Partitions added to a topic
waited the same way. ``streams/runtime/app.py`` refreshes every 30 s.

Before (old code): the next round is handled ~300 s after the topic is back (two runs: 298 s, >300 s): the
test times out at 90 s.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from opsloop.config import load_settings
from opsloop.kafka_admin import ensure_topics
from opsloop.topics import Topic
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import scrape_metric, unique, wait_until, write_config
from tests.scale.workload import keys_covering
from tests.streams.agents.test_integration import iptables_round

pytestmark = pytest.mark.integration

PARTITIONS = 4


def test_a_deleted_and_recreated_telemetry_topic_is_consumed_again_within_a_minute(stack: Any, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    config, doc = pipeline_config(tmp_path, stack)
    prefix = unique("recreate") + "."   # topics of its own
    doc["kafka"].update(topic_prefix=prefix, partitions=PARTITIONS)
    doc.setdefault("streams", {})["detectors"] = {"anomaly": {"enabled": False}}
    write_config(config, doc)
    port = doc["stream"]["metrics_port"]
    iptables = prefix + Topic.IPTABLES.value
    ensure_topics(load_settings(str(config)).kafka, PARTITIONS)
    t0 = time.time() - 7200
    hvs = keys_covering(unique("hv"), 1, PARTITIONS)

    def send(ts: float) -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")   # fresh metadata: the topic as it is
        try:
            for hv in hvs:
                producer.send(iptables, key=hv.encode(), value=iptables_round(hv, ts, {"p-open": False}))
            producer.flush()
        finally:
            producer.close()

    def handled(ts: float) -> bool:
        return all(scrape_metric(port, "opsloop_firewall_report_timestamp_seconds", {"hypervisor": hv}) == ts
                   for hv in hvs)

    worker = start_worker(tmp_path, config, doc, stack)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        send(t0)
        wait_until(lambda: handled(t0), timeout=90, what="the first round handled")
        old_id = topic_id(admin, iptables)
        assert old_id is not None
        admin.delete_topics([iptables])

        def back() -> bool:   # created again: by us, or already by the broker for a client asking for it
            try:
                admin.create_topics([NewTopic(iptables, PARTITIONS, 1)])
            except TopicAlreadyExistsError:
                pass   # the old one not gone yet, or the new one there already
            return topic_id(admin, iptables) not in (None, old_id)
        wait_until(back, timeout=30, interval=0.5, what="the topic created again")

        def consumed_again() -> bool:
            assert worker.running(), f"the worker exited: {worker.tail(40)}"
            send(t0 + 60)
            return handled(t0 + 60)
        wait_until(consumed_again, timeout=90, interval=2, what="the re-created topic's records handled")
    finally:
        admin.close()
        worker.stop()


def topic_id(admin: KafkaAdminClient, topic: str) -> Any:
    """The topic's id (a topic created again has a new one); None while it does not exist or has no partition."""
    [desc] = admin.describe_topics([topic])
    return desc.get("topic_id") if not desc.get("error_code") and desc.get("partitions") else None
