"""The paging actuator killed with SIGKILL mid-stream and restarted (same consumer group, same state
file): every finding pages exactly once, every clear resolves exactly once, and findings published while
it was down are paged/resolved after the restart. (The stream worker's SIGKILL is covered by
tests/streams/agents/test_integration.py; the actuator restart after an Alertmanager outage by
tests/controllers/paging/test_e2e.py.)

Replays after the kill are expected (offsets are committed after the state is saved): the test checks
they never reach the on-call as a second page.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from kafka import KafkaProducer

from opsloop.records import Finding, Severity
from tests.alerting import am_url, ensure_topics, start_actuator, start_alertmanager, webhook_receiver
from tests.helpers import read_topic, scrape_metric, unique, wait_until

pytestmark = pytest.mark.integration


def finding(host: str, first_seen: float, cleared: bool = False, observed: float = 248.0) -> Finding:
    return Finding(detector="power.generation_deviation", what="power draw deviates from its generation",
                   where={"host": host, "generation": "gen3"}, observed=observed, expected=155.0,
                   severity=Severity.CRITICAL, explanation="fault test", first_seen=first_seen,
                   last_seen=time.time(), cleared=cleared)


def deliveries(webhook: Any, host: str, status: str) -> int:
    return sum(1 for d in webhook.at("/page") for a in d.body["alerts"]
               if a["labels"].get("host") == host and a["status"] == status)


def test_sigkilled_actuator_never_pages_twice(stack, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    ensure_topics(bootstrap, "findings", "audit")
    tag = unique("kill")
    hosts = [f"{tag}-h{i}" for i in range(10)]
    first_seen = {h: time.time() - 60 for h in hosts}
    group = unique("opsloop-paging-kill")
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")

    def publish(*fs: Finding) -> None:
        for f in fs:
            producer.send("findings", key=f.id.encode(), value=f.encode())
        producer.flush()

    def opened_in_audit(host: str) -> bool:
        ids = {finding(host, first_seen[host]).id}
        return any(orjson.loads(r.value).get("labels", {}).get("finding_id") in ids and orjson.loads(r.value)["action"] ==
                   "page_opened" for r in read_topic(bootstrap, "audit"))

    with webhook_receiver() as webhook:
        am = start_alertmanager(tmp_path / "am", webhook)
        actuator, port = start_actuator(tmp_path / "paging", bootstrap, am_url(am), group_id=group)
        try:
            # Phase 1: six findings paged.
            publish(*(finding(h, first_seen[h]) for h in hosts[:6]))
            for h in hosts[:6]:
                wait_until(lambda h=h: deliveries(webhook, h, "firing"), timeout=60, what=f"page for {h}")

            # Phase 2, mid-stream: clears for h0-h2 and new findings h6-h8; SIGKILL as soon as the actuator
            # has acted on the first new one (the rest may be half done: delivered but not saved/committed).
            publish(*(finding(h, first_seen[h], cleared=True) for h in hosts[:3]),
                    *(finding(h, first_seen[h]) for h in hosts[6:9]))
            wait_until(lambda: opened_in_audit(hosts[6]), timeout=60, interval=0.2, what="actuator acting on h6")
            actuator.kill()

            # While it is down: refreshes of h3-h5, a clear of h6, a new finding h9.
            publish(*(finding(h, first_seen[h], observed=250.0) for h in hosts[3:6]),
                    finding(hosts[6], first_seen[hosts[6]], cleared=True), finding(hosts[9], first_seen[hosts[9]]))

            actuator, port = start_actuator(tmp_path / "paging", bootstrap, am_url(am), group_id=group)
            for h in hosts[6:]:
                wait_until(lambda h=h: deliveries(webhook, h, "firing"), timeout=60, what=f"page for {h}")
            for h in (*hosts[:3], hosts[6]):
                wait_until(lambda h=h: deliveries(webhook, h, "resolved"), timeout=60, what=f"resolve for {h}")
            # Let the restarted actuator re-send its open alerts twice: still no second notification.
            sent = scrape_metric(port, "opsloop_paging_alerts_sent_total", {"state": "firing"}) or 0.0
            wait_until(lambda: (scrape_metric(port, "opsloop_paging_alerts_sent_total", {"state": "firing"}) or 0)
                       >= sent + 2 * 5, timeout=60, what="two rounds of re-sends")

            assert {h: deliveries(webhook, h, "firing") for h in hosts} == {h: 1 for h in hosts}
            resolved = {h: deliveries(webhook, h, "resolved") for h in hosts}
            assert resolved == {h: int(h in (*hosts[:3], hosts[6])) for h in hosts}
            active = requests.get(f"{am_url(am)}/api/v2/alerts", params={"active": "true"}, timeout=5).json()
            still_open = {a["labels"]["host"] for a in active if a["labels"].get("host", "").startswith(tag)
                          and a["status"]["state"] == "active"}
            assert still_open == {*hosts[3:6], *hosts[7:]}
            # (the gauge also counts open findings of other tests: the group reads the topic from the start)
            assert (scrape_metric(port, "opsloop_paging_active_alerts") or 0) >= 5.0
            assert actuator.running()
        finally:
            producer.close()
            actuator.stop()
            am.stop()
