"""Stale telemetry says so on the alert path: the worker's ``opsloop_stream_sample_age_seconds`` rises,
the real ``OpsloopStaleData`` rule (alerts/rules/pipeline.yml) fires in a real Prometheus and reaches the
ticket webhook through our Alertmanager config; fresh samples resolve it.

Only the rule's ``for:`` is shortened (5m -> 1s) in a copy: the expression and labels are the file's. This
Prometheus scrapes only this test's worker, so nothing else can make the topic look stale or fresh.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka import KafkaProducer

from opsloop.stack import free_port
from opsloop.stack.components import prometheus
from opsloop.records import metric
from opsloop.topics import Topic
from opsloop.wire import encode_batch
from tests.alerting import start_alertmanager, webhook_receiver
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import REPO, prom_query, scrape_metric, unique, wait_until, write_config

pytestmark = pytest.mark.integration

RULE = "OpsloopStaleData"


def stale_rule_copy(dest: Path) -> Path:
    doc = yaml.safe_load((REPO / "alerts" / "rules" / "pipeline.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == RULE]
    assert len(rules) == 1, f"{RULE} not found once in pipeline.yml"
    rules[0]["for"] = "1s"
    dest.write_text(yaml.safe_dump({"groups": [{"name": "stale-under-test", "rules": rules}]}))
    return dest


def send_power(bootstrap: str, host: str, ts: float) -> None:
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        p.send(Topic.IPMI.value, key=host.encode(),
               value=encode_batch([metric("ipmi_power", {"watts": 150.0}, {"host": host, "source": "dcmi"}, ts)]))
        p.flush()
    finally:
        p.close()


def stale_alerts(webhook: Any, status: str) -> list[dict[str, Any]]:
    return [a for d in webhook.at("/ticket") if d.body.get("status") == status for a in d.body["alerts"]
            if a["labels"].get("alertname") == RULE and a["labels"].get("topic") == Topic.IPMI.value
            and a["status"] == status]


def test_stale_samples_fire_the_stale_data_alert_and_fresh_ones_resolve_it(stack, tmp_path: Path) -> None:
    config, doc = pipeline_config(tmp_path, stack)
    doc.setdefault("streams", {})["detectors"] = {"anomaly": {"enabled": False}}
    write_config(config, doc)
    wport = doc["stream"]["metrics_port"]
    host = unique("stale")
    worker = start_worker(tmp_path, config, doc, stack)
    with webhook_receiver() as webhook:
        am = start_alertmanager(tmp_path / "am", webhook)
        am_host, am_port = am.ports["web"]
        prom = prometheus(tmp_path / "prom", "127.0.0.1", free_port(), [f"127.0.0.1:{wport}"], 1.0,
                          f"{am_host}:{am_port}", rule_files=[stale_rule_copy(tmp_path / "stale.yml")])
        prom.start()
        prom_url = f"http://127.0.0.1:{prom.ports['web'][1]}"
        try:
            # Fresh data first (the worker has also read the topic's history by then): no alert.
            def fresh() -> bool:
                send_power(stack.kafka_bootstrap, host, time.time())
                age = scrape_metric(wport, "opsloop_stream_sample_age_seconds", {"topic": Topic.IPMI.value})
                return age is not None and age < 60
            wait_until(fresh, timeout=90, interval=1, what="fresh samples seen by the worker")
            wait_until(lambda: prom_query(prom_url, f'opsloop_stream_sample_age_seconds{{topic="{Topic.IPMI}"}} < 60'),
                       timeout=30, what="fresh age in Prometheus")
            assert prom_query(prom_url, f'ALERTS{{alertname="{RULE}",topic="{Topic.IPMI}"}}') == []

            # The collector's clock (or a spool replay) delivers hour-old samples.
            send_power(stack.kafka_bootstrap, host, time.time() - 3600)
            fired = wait_until(lambda: stale_alerts(webhook, "firing"), timeout=60, what="stale-data alert at webhook")
            alert = fired[0]
            assert alert["labels"]["severity"] == "warning" and alert["labels"]["signal"] == "pipeline"
            assert alert["annotations"]["summary"].startswith(f"{Topic.IPMI}: newest sample is 1h")
            assert alert["annotations"]["runbook_url"].endswith("/pipeline.md#opsloop-stale-data")
            assert scrape_metric(wport, "opsloop_stream_sample_age_seconds", {"topic": Topic.IPMI.value}) >= 3600

            # Fresh samples again: the alert resolves at the webhook.
            def resolved() -> list[dict[str, Any]]:
                send_power(stack.kafka_bootstrap, host, time.time())
                return stale_alerts(webhook, "resolved")
            wait_until(resolved, timeout=120, interval=1, what="stale-data alert resolved")
            assert worker.running()
        finally:
            prom.stop()
            am.stop()
            worker.stop()
