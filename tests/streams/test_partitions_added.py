"""Partitions added to a telemetry topic while the worker runs (real worker, real Kafka).

An operator raises a topic's partition count (the consumer-lag runbook says so) with
``kafka-topics --alter --partitions`` or an admin client's ``create_partitions``. The worker's consumer sees
the new partitions at its next metadata refresh (``consumer_metadata_max_age_ms``, 5 min; 2 s here through
Faust's environment variable), rebalances and reads them from the start. The detectors' state changelog keeps
its partition count: a key whose records now come from a partition beyond it has no changelog partition to be
written to.

Before (old code): that write reached the producer, which asserts on a partition it does not know, inside
Faust's producer buffer task: ``ProducerBuffer: Crashed reason=AssertionError('Unrecognized partition')``, the
worker stopped, and every restart replayed the batch (its offsets never committed: the commit flushes that
producer) and crashed again, the findings of that batch published once more each time.
Now: the state of those keys is kept in memory and not written (log ``state_not_written``, counted in
``opsloop_stream_errors_total``); the worker goes on, the keys of the old partitions are written as before, and
once the changelog is grown as well their state is written too (the worker refreshes its producer's metadata,
which would otherwise know the old count for up to 5 min).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewPartitions

from opsloop.config import load_settings
from opsloop.kafka_admin import ensure_topics
from opsloop.topics import Topic
from opsloop.streams.agents.stateful import STATE_TABLE
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import read_topic, scrape_metric, unique, wait_until, write_config
from tests.scale.workload import keys_covering, partition_of
from tests.streams.agents.test_integration import iptables_round, state_in_changelog

pytestmark = pytest.mark.integration

BEFORE, AFTER = 2, 4
METADATA_MAX_AGE_MS = "2000"   # the worker's consumer sees the new partitions within seconds, not 5 min


def grow(bootstrap: str, topics: list[str], count: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_partitions({t: NewPartitions(total_count=count) for t in topics})
    finally:
        admin.close()


def changelog_partitions_of(bootstrap: str, app_id: str, hv: str) -> set[int]:
    key = orjson.dumps(f"firewall-detector|{hv}")
    return {r.partition for r in read_topic(bootstrap, f"{app_id}-{STATE_TABLE}-changelog") if r.key == key}


def test_partitions_added_to_a_telemetry_topic_neither_crash_the_worker_nor_stop_its_state(
        stack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Faust reads its settings from the environment too (the worker inherits it). The producer's metadata keeps
    # its 5 min: the changelog grown, the worker asks it for fresh metadata itself.
    monkeypatch.setenv("CONSUMER_METADATA_MAX_AGE_MS", METADATA_MAX_AGE_MS)
    bootstrap = stack.kafka_bootstrap
    config, doc = pipeline_config(tmp_path, stack)
    prefix = unique("padd") + "."   # topics of its own: the others' keep their partition counts
    doc["kafka"].update(topic_prefix=prefix, partitions=BEFORE)
    doc.setdefault("streams", {})["detectors"] = {"anomaly": {"enabled": False}}
    write_config(config, doc)
    port, app_id = doc["stream"]["metrics_port"], prefix + doc["stream"]["app_id"]
    iptables = prefix + Topic.IPTABLES.value
    t0 = time.time() - 7200
    # old: in the same partition before and after (a key whose partition changes is a new partition's key)
    old = [k for k in keys_covering(unique("hv-old"), 1, AFTER) if partition_of(k, AFTER) < BEFORE]
    new = [k for k in keys_covering(unique("hv-new"), 1, AFTER) if partition_of(k, AFTER) >= BEFORE]
    producers = [KafkaProducer(bootstrap_servers=bootstrap, acks="all")]

    def send(hvs: list[str], ts: float) -> None:
        for hv in hvs:
            producers[-1].send(iptables, key=hv.encode(), value=iptables_round(hv, ts, {"p-open": False}))
        producers[-1].flush()

    def handled(hvs: list[str], ts: float) -> bool:
        return all(scrape_metric(port, "opsloop_firewall_report_timestamp_seconds", {"hypervisor": hv}) == ts
                   for hv in hvs)

    def stored(hv: str, ts: float) -> bool:
        state = state_in_changelog(bootstrap, app_id, f"firewall-detector|{hv}")
        return bool(state) and state["report"]["timestamp"] == ts

    # created before anything is sent: the broker's auto-creation would give them its num.partitions
    ensure_topics(load_settings(str(config)).kafka, BEFORE)
    worker = start_worker(tmp_path, config, doc, stack)
    try:
        send(old, t0)
        wait_until(lambda: handled(old, t0), timeout=90, what="the first rounds handled")
        grow(bootstrap, [iptables], AFTER)
        producers.append(KafkaProducer(bootstrap_servers=bootstrap, acks="all"))   # knows the new partitions

        # the new partitions are consumed; the worker keeps running and handling both old and new keys
        def both_handled() -> bool:
            assert worker.running(), f"the worker exited: {worker.tail(40)}"
            send(old, t0 + 60)
            send(new, t0 + 60)
            return handled(old + new, t0 + 60)
        wait_until(both_handled, timeout=90, interval=1, what="records of the new partitions handled")
        send(old + new, t0 + 120)
        wait_until(lambda: handled(old + new, t0 + 120), timeout=60, what="the next round handled")
        assert worker.running(), f"the worker exited: {worker.tail(40)}"
        # the old partitions' state is written as before; the new ones' is said, not written
        wait_until(lambda: all(stored(hv, t0 + 120) for hv in old), timeout=60, what="old keys' state written")
        written = {hv: p for hv in new if (p := changelog_partitions_of(bootstrap, app_id, hv))}
        assert not written, f"state of keys of the new partitions written to {written}"
        log = worker.logfile.read_text()
        assert '"event":"state_not_written"' in log.replace(" ", ""), worker.tail(40)
        assert "Unrecognized partition" not in log
        assert (scrape_metric(port, "opsloop_stream_errors_total", {"agent": "detectors"}) or 0) >= 1

        # the changelog (and the other telemetry topics) grown too: the new keys' state is written
        changelog = f"{app_id}-{STATE_TABLE}-changelog"
        grow(bootstrap, [changelog] + [prefix + t.value for t in (Topic.IPMI, Topic.NETPERF, Topic.KEYSTONE)],
             AFTER)

        def new_stored() -> bool:
            assert worker.running(), f"the worker exited: {worker.tail(40)}"
            send(old + new, t0 + 180)
            return all(stored(hv, t0 + 180) for hv in old + new)
        wait_until(new_stored, timeout=90, interval=2, what="every key's state written once the changelog grew")
        assert "Unrecognized partition" not in worker.logfile.read_text()
    finally:
        for producer in producers:
            producer.close()
        worker.stop()
