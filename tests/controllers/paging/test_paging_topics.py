"""Paging's topics on the broker: created at start, and a missing audit topic never holds up a page.

* Started before the stream workers (which create the topics), the paging actuator subscribed to a ``findings``
  topic that did not exist and wrote audit records to an ``audit`` topic that did not exist: kafka-python logged an
  error at each start ("Topic ... not found in cluster metadata") and the broker auto-created both with its own
  defaults, not ``kafka.partitions``. Now the service creates what is missing (as the edge service and the worker
  do) before its consumer asks.
* On brokers that do not auto-create topics (metadata requests without auto-creation here: the same answer),
  every audit ``send`` to a missing topic blocked the producer's ``max_block_ms`` (5 s) inside the paging step,
  one record after another: the pages behind them waited. Now one send times out, the records of the next minute
  are counted lost at once, and the topic is tried again after it.

Real Kafka and the real Alertmanager of the tests; each test its own topic prefix.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import orjson
import pytest

from opsloop.config import KafkaSettings
from opsloop.kafka_clients import service_producer
from opsloop.stack import ManagedProcess
from opsloop.topics import Topic
from opsloop.controllers.paging import audit as audit_module, metrics
from opsloop.controllers.paging.service import PagingService
from opsloop.log import Sampled
from tests.controllers.paging.test_state_and_audit_failures import config, failures, firing, page, publish
from tests.helpers import (CountingProducer, KeptLines, create_topics, read_topic, topic_partitions, unique,
                           wait_until)

pytestmark = pytest.mark.integration


def test_a_missing_audit_topic_costs_one_blocked_send_a_minute_not_one_per_record(
        tmp_path: Path, kafka_bootstrap: str, test_alertmanager: ManagedProcess,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit_module, "FAIL_LOG", Sampled(60.0), raising=False)
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique("noaudit") + ".")
    findings, audit = kafka.topic(Topic.FINDINGS), kafka.topic(Topic.AUDIT)
    create_topics(kafka_bootstrap, findings)   # no audit topic, and the producer may not auto-create it
    real = service_producer(kafka, unique("paging"), linger_ms=5, max_block_ms=5000, request_timeout_ms=5000)
    # a broker that does not auto-create: the metadata request must not ask it to (kafka-python 3.0.12 drops the
    # producer's allow_auto_create_topics=False on its way to the cluster metadata that builds the request)
    real._metadata.config["allow_auto_create_topics"] = False
    producer = CountingProducer(real, audit)
    svc = PagingService(config(tmp_path, test_alertmanager), kafka, producer=producer)
    clock = [1000.0]
    svc.auditor.clock = lambda: clock[0]
    svc._connect()
    run, lost = unique("hv"), failures(metrics.AUDIT_FAILURES)
    hvs = {f"{run}-{i}" for i in range(3)}
    try:
        publish(kafka_bootstrap, findings, *(page(hv) for hv in sorted(hvs)))
        wait_until(lambda: (svc.step(), firing(test_alertmanager, run) == hvs)[1], timeout=90,
                   what="the three pages delivered")
        # page_opened and page_delivered of each: all counted lost, one of them sent (and blocked)
        assert failures(metrics.AUDIT_FAILURES) - lost == 6
        assert producer.sends == 1, f"{producer.sends} audit sends blocked the paging step"

        create_topics(kafka_bootstrap, audit)   # the topic is there now: tried again a minute on, and written
        clock[0] += audit_module.UNAVAILABLE_RETRY_S
        fourth = f"{run}-3"
        publish(kafka_bootstrap, findings, page(fourth))
        wait_until(lambda: (svc.step(), fourth in firing(test_alertmanager, run))[1], timeout=60,
                   what="the fourth page delivered")
        svc.auditor.flush()
        assert producer.sends == 3 and failures(metrics.AUDIT_FAILURES) - lost == 6
        actions = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, audit)]
        assert [(a["action"], a["labels"]["hypervisor"]) for a in actions] == [("page_opened", fourth),
                                                                              ("page_delivered", fourth)]
    finally:
        svc.close()


def test_paging_creates_its_topics_with_the_configured_partitions_before_it_asks_for_them(
        tmp_path: Path, kafka_bootstrap: str, test_alertmanager: ManagedProcess) -> None:
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique("fresh") + ".", partitions=2)
    findings, audit, deadletter = (kafka.topic(t) for t in (Topic.FINDINGS, Topic.AUDIT, Topic.DEADLETTER))
    svc = PagingService(config(tmp_path, test_alertmanager), kafka)
    client_lines = KeptLines(logging.WARNING)
    logging.getLogger("kafka").addHandler(client_lines)
    stop = threading.Event()
    loop = threading.Thread(target=svc.run, args=(stop,), daemon=True)
    run = unique("hv")
    try:
        loop.start()
        wait_until(lambda: topic_partitions(kafka_bootstrap, findings) > 0, timeout=60, what="the findings topic")
        publish(kafka_bootstrap, findings, page(f"{run}-1"))
        wait_until(lambda: firing(test_alertmanager, run) == {f"{run}-1"}, timeout=60, what="the page delivered")
    finally:
        stop.set()
        loop.join(timeout=30)
        logging.getLogger("kafka").removeHandler(client_lines)
    assert not loop.is_alive()
    assert [ln for ln in client_lines.lines if "not found in cluster metadata" in ln] == []
    assert {t: topic_partitions(kafka_bootstrap, t) for t in (findings, audit, deadletter)} == \
        {findings: 2, audit: 2, deadletter: 2}
