"""A round larger than the broker's message limit (one key: a HAProxy with thousands of servers).

A round travels as one record per (topic, key). A record above the broker's ``message.max.bytes``
(1 MB by default) is refused for good: were it spooled, it would head the spool forever and every
later round would queue behind it (the collector silently stops delivering). The publisher cuts a
group into records under the limit, in order, so the round arrives whole and the spool stays empty.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from opsloop.collect.publisher import MAX_RECORD_BYTES, Publisher, records_for
from opsloop.records import metric
from tests.helpers import read_topic, unique

pytestmark = pytest.mark.integration

SERVERS = 12_000   # ~1.9 MB as one record: above the broker's 1 MB default


def _round(host: str, seq: int) -> list:
    return [metric("lb_fault_big", {"seq": seq, "server": i, "rate": 1.5 * i}, {"host": host, "srv": f"srv-{i:05d}"},
                   timestamp=1_700_000_000.0 + seq)
            for i in range(SERVERS)]


def test_records_for_cuts_a_group_under_the_limit_in_order() -> None:
    ms = _round("h1", 0)
    records = records_for(ms)
    assert len(records) > 1
    assert all(len(r.value) <= MAX_RECORD_BYTES for r in records)
    assert {r.key for r in records} == {"h1"}
    servers = [m["fields"]["server"] for r in records for m in orjson.loads(r.value)["metrics"]]
    assert servers == list(range(SERVERS))


def test_a_round_above_the_broker_limit_arrives_whole_and_does_not_block_the_spool(stack, tmp_path: Path) -> None:
    host = unique("huge")
    publisher = Publisher(stack.kafka_bootstrap, tmp_path / "spool", collector="huge", send_timeout_s=5.0)
    try:
        publisher.publish_metrics(_round(host, 0))
        publisher.publish_metrics(_round(host, 1)[:10])   # the next, ordinary round
        assert publisher.flush(60), "the rounds were not acknowledged"
        assert publisher.spool.empty(), f"{publisher.spool.count_records()} record(s) stuck in the spool"
    finally:
        publisher.close()
    got = [(m["fields"]["seq"], m["fields"]["server"])
           for rec in read_topic(stack.kafka_bootstrap, "telemetry.lb", timeout_s=30)
           if rec.key == host.encode() for m in orjson.loads(rec.value)["metrics"]]
    assert got == [(0, i) for i in range(SERVERS)] + [(1, i) for i in range(10)]
