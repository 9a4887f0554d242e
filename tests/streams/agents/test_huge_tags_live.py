"""A telemetry sample whose tags are 700 kB long (within Kafka's 1 MB record), through a real stream worker on
a real broker: the worker stays up, the samples are used (the power gauge carries the host shortened to a
prefix and a hash; the LB rate too), the cut is counted, the good record after it is processed, and the
detector state of that series goes to its changelog (a 1.4 MB anomaly state would have been beyond Kafka's
message size). Before: the whole tag was a label value, and the anomaly series key and state held it whole."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
from kafka import KafkaProducer

from opsloop.records import metric
from opsloop.streams.runtime.gauges import MAX_LABEL_VALUE
from opsloop.topics import Topic
from opsloop.wire import encode_batch
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import scrape_metric, unique, wait_until, write_config

pytestmark = pytest.mark.integration

HUGE = 700_000


def test_huge_tags_are_bounded_labels_and_the_worker_goes_on(stack, tmp_path: Path) -> None:
    config, doc = pipeline_config(tmp_path, stack)
    doc.setdefault("streams", {})["detectors"] = {"anomaly": {"series": [{"metric": "ipmi_power", "field": "watts"}],
                                                              "detector": {"warmup_points": 3}}}
    write_config(config, doc)
    worker = start_worker(tmp_path, config, doc, stack)
    port = doc["stream"]["metrics_port"]
    key = unique("huge")
    host = key + "-" + "h" * HUGE
    ts = time.time() - 60
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all", max_request_size=2 ** 20)
    try:
        for i in range(6):   # the anomaly series warms up (3 points) and is scored: its state is written
            producer.send(Topic.IPMI.value, key=key.encode(), value=encode_batch(
                [metric("ipmi_power", {"watts": 200.0 + i % 2}, {"host": host, "rack": "r" * 200_000}, ts + i)]))
        for n, dt in ((0, 0), (70, 10)):   # a rate needs two rounds
            producer.send(Topic.LB.value, key=key.encode(), value=encode_batch(
                [metric("haproxy", {"hrsp_2xx": n, "status": "UP"}, {"host": host, "proxy": "be", "sv": "s1",
                                                                      "type": "server"}, ts + dt)]))
        good = unique("good")
        producer.send(Topic.IPMI.value, key=key.encode(), value=encode_batch(
            [metric("ipmi_power", {"watts": 150.0}, {"host": good}, ts + 10)]))
        producer.flush()
    finally:
        producer.close()
    try:
        wait_until(lambda: scrape_metric(port, "opsloop_power_watts", {"host": good}), timeout=90,
                   what="the good record after the huge ones processed")
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        longest = max((len(line) for line in text.splitlines()), default=0)
        assert longest < 4 * MAX_LABEL_VALUE, longest                      # no label value is the tag whole
        shown = [line for line in text.splitlines() if line.startswith("opsloop_power_watts{") and key in line]
        assert shown, "the huge host's samples were lost"
        rate = [line for line in text.splitlines()
                if line.startswith("opsloop_lb_server_requests_per_second{") and key in line]
        assert rate and rate[0].endswith(" 7.0"), rate
        assert (scrape_metric(port, "opsloop_stream_label_values_shortened_total") or 0) > 0
        time.sleep(3)   # the batch's state went to the changelog: a record too large would crash the worker
        assert worker.running()
    finally:
        worker.stop()
