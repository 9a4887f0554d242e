"""A record the broker refuses for good does not hold the collector's later rounds (real broker).

The LB topic of this test's prefix takes records of at most 2000 bytes (``max.message.bytes``, as an operator may
set it): a round whose LB record is larger is refused by the broker with a non-retriable error. Before, the
publisher spooled it like a broker outage's records and sent it again at every try: refused again, it headed the
spool for good and every later round, of every topic, queued behind it (the collector delivered nothing more and
said only ``kafka_send_failed``); and kafka-python's idempotent producer took the refusal as fatal, so the round's
other records (here the IPMI one) failed with it. Now the refused record is counted lost and logged
(``record_refused``), the rest of the round and the later rounds are delivered, the spool stays empty.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY

from opsloop.collect.publisher import Publisher
from opsloop.config import KafkaSettings
from opsloop.records import metric
from tests.helpers import create_topics, read_topic, unique

pytestmark = pytest.mark.integration

LIMIT = 2000


def _lb(host: str, seq: int, servers: int) -> list:
    return [metric("lb_refused", {"seq": seq, "server": i, "rate": 1.5 * i}, {"host": host, "srv": f"srv-{i:05d}"},
                   timestamp=1_700_000_000.0 + seq) for i in range(servers)]


def _power(host: str, seq: int) -> list:
    return [metric("ipmi_power", {"watts": 200.0 + seq}, {"host": host}, timestamp=1_700_000_000.0 + seq)]


def test_a_record_refused_for_good_is_counted_lost_and_later_rounds_are_delivered(kafka_bootstrap: str,
                                                                                    tmp_path: Path) -> None:
    prefix, host, collector = f"{unique('refused')}.", unique("h"), unique("refusing")
    create_topics(kafka_bootstrap, f"{prefix}telemetry.lb", max_message_bytes=LIMIT)
    create_topics(kafka_bootstrap, f"{prefix}telemetry.ipmi")
    publisher = Publisher(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix), tmp_path / "spool",
                          collector=collector, send_timeout_s=5.0)
    try:
        publisher.publish_metrics(_lb(host, 0, 200) + _power(host, 0))   # its LB record ~15 kB: refused
        publisher.publish_metrics(_lb(host, 1, 2) + _power(host, 1))     # an ordinary round
        assert publisher.flush(60), "the rounds were not settled"
        assert publisher.spool.empty(), f"{publisher.spool.count_records()} record(s) stuck in the spool"
    finally:
        publisher.close()
    assert REGISTRY.get_sample_value("opsloop_collector_lost_records_total", {"collector": collector}) == 1.0
    lb = [(m["fields"]["seq"], m["fields"]["server"])
          for rec in read_topic(kafka_bootstrap, f"{prefix}telemetry.lb", timeout_s=30)
          for m in orjson.loads(rec.value)["metrics"]]
    power = [m["fields"]["watts"] for rec in read_topic(kafka_bootstrap, f"{prefix}telemetry.ipmi", timeout_s=30)
             for m in orjson.loads(rec.value)["metrics"]]
    assert lb == [(1, 0), (1, 1)]
    assert power == [200.0, 201.0]
