"""Paging restarted (SIGKILL) while Kafka is away: the pages it delivered before are kept up in Alertmanager
and the resolves it owed go out, before it reaches a broker and catches up.

Before, a restarted paging loaded its state only once Kafka answered and re-sent nothing until it had caught up
with the findings topic: with Kafka away for longer than an alert's ``endsAt`` horizon (``ends_after_s``, 4 re-send
intervals) every open page expired in Alertmanager (on-call told "resolved" while the problem stood, and paged a
second time when Kafka came back), and a resolve owed from before the restart was never sent meanwhile (a restarted
Alertmanager, which keeps no alerts, never notified it). Against the real Kafka, Alertmanager and paging process.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from kafka import KafkaProducer

from opsloop.controllers.paging.book import PagingBook
from opsloop.records import Finding, Severity
from opsloop.stack import free_port
from tests.alerting import am_url, ensure_topics, start_actuator, start_alertmanager, webhook_receiver
from tests.helpers import unique, wait_until

pytestmark = pytest.mark.integration


def finding(host: str, first_seen: float, cleared: bool = False) -> Finding:
    return Finding(detector="power.generation_deviation", what="power draw deviates from its generation",
                   where={"host": host, "generation": "gen3"}, observed=248.0, expected=155.0,
                   severity=Severity.CRITICAL, explanation="kafka away", first_seen=first_seen,
                   last_seen=time.time(), cleared=cleared)


def at_receiver(webhook: Any, host: str, status: str) -> int:
    return sum(1 for d in webhook.at("/page") for a in d.body["alerts"]
               if a["labels"].get("host") == host and a["status"] == status)


def active_in(am: Any, host: str) -> bool:
    alerts = requests.get(f"{am_url(am)}/api/v2/alerts", params={"active": "true"}, timeout=5).json()
    return any(a["labels"].get("host") == host and a["status"]["state"] == "active" for a in alerts)


def owed_resolves(state: Path, host: str) -> bool:
    try:
        doc = orjson.loads(state.read_bytes())
    except (OSError, ValueError):
        return False
    return any(r["labels"].get("host") == host for r in doc.get("resolves", []))


def test_a_restart_while_kafka_is_away_keeps_the_pages_up_and_sends_the_resolves_owed(stack, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    ensure_topics(bootstrap, "findings", "audit")
    tag = unique("kafka-away")
    up, down = f"{tag}-up", f"{tag}-down"
    first_seen = time.time() - 60
    group = unique("opsloop-paging-kafka-away")
    port = free_port()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")

    def publish(*fs: Finding) -> None:
        for f in fs:
            producer.send("findings", key=f.id.encode(), value=f.encode())
        producer.flush()

    with webhook_receiver() as webhook:
        am = start_alertmanager(tmp_path / "am", webhook, port=port)
        actuator, _ = start_actuator(tmp_path / "paging", bootstrap, am_url(am), group_id=group)
        try:
            publish(finding(up, first_seen), finding(down, first_seen))
            for h in (up, down):
                wait_until(lambda h=h: at_receiver(webhook, h, "firing"), timeout=60, what=f"the page of {h}")
            am.stop()   # away: the clear of `down` is read and its resolve owed (in the state file)
            publish(finding(down, first_seen, cleared=True))
            wait_until(lambda: owed_resolves(tmp_path / "paging" / "state.json", down), timeout=60,
                       what="the resolve owed in the state file")
            actuator.kill()

            # Alertmanager back (its alerts are in memory: gone; its notification log says both were paged) and
            # paging restarted with Kafka away (no broker at its bootstrap address)
            am = start_alertmanager(tmp_path / "am", webhook, port=port)
            actuator, _ = start_actuator(tmp_path / "paging", f"127.0.0.1:{free_port()}", am_url(am),
                                         group_id=group)
            wait_until(lambda: at_receiver(webhook, down, "resolved"), timeout=60, what="the resolve owed, sent")
            wait_until(lambda: active_in(am, up), timeout=60, what="the open page kept up in Alertmanager")
            assert actuator.running()
            assert at_receiver(webhook, up, "firing") == 1 and at_receiver(webhook, down, "firing") == 1
            assert at_receiver(webhook, up, "resolved") == 0
        finally:
            producer.close()
            actuator.stop()
            am.stop()


def test_before_it_caught_up_only_what_alertmanager_still_holds_is_sent() -> None:
    """A page expired in Alertmanager (saved last send older than ``alert_ttl_s``) is not re-fired before paging has
    caught up: its clear may be among the records not read yet (a second page, then its resolve)."""
    t0 = 1_795_310_400.0
    saved = PagingBook(resend_interval_s=60, alert_ttl_s=240)
    held, expired, new = (finding(h, t0).model_copy(update={"last_seen": t0}) for h in ("held", "expired", "new"))
    for f in (held, expired):
        saved.apply(f, t0)
    saved.delivered(t0)
    saved.open[expired.id].last_sent = t0 - 300   # its last send long before: expired in Alertmanager
    saved.apply(new, t0 + 1)   # never delivered: it pages once paging has caught up

    b = PagingBook(resend_interval_s=60, alert_ttl_s=240)
    b.restore(orjson.loads(orjson.dumps(saved.to_dict())))
    now = t0 + 10
    sent = b.outgoing(now, held_only=True)
    assert [o.record.finding_id for o in sent] == [held.id]
    b.delivered(now, held_only=True)
    assert b.open[held.id].last_sent == now and b.open[new.id].last_sent is None
    assert {o.record.finding_id for o in b.outgoing(now)} == {expired.id, new.id}   # caught up: as before
    # saved again before it sent them: the last send from before the restart is kept
    again = PagingBook(resend_interval_s=60, alert_ttl_s=240)
    again.restore(orjson.loads(orjson.dumps(b.to_dict())))
    assert [o.record.finding_id for o in again.outgoing(now, held_only=True)] == [held.id]
