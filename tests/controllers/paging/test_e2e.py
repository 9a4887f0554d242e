"""End to end with the real Kafka and Alertmanager: a finding on the `findings` topic pages at a
webhook (generic webhook and PagerDuty Events v2), re-publishing it does not page again, clearing it
delivers the resolve; inhibition (hypervisor down), the Keystone mute, Alertmanager outages and the
example silences."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
import requests

from opsloop.records import Finding, Severity
from opsloop.stack import ManagedProcess, free_port
from tests.alerting import (ROUTING_KEY, WebhookReceiver, am_url, start_actuator, start_alertmanager,
                                   webhook_receiver)
from tests.helpers import REPO, read_topic, scrape_metric, unique, wait_until

pytestmark = pytest.mark.integration


def make_finding(detector: str, where: dict[str, str], severity: Severity = Severity.CRITICAL,
                 cleared: bool = False, first_seen: float | None = None, observed: Any = "chain absent") -> Finding:
    now = time.time()
    return Finding(detector=detector, what="VM port without its security-group chain" if "firewall" in detector
                   else f"{detector} finding", where=where, observed=observed, expected="chain present",
                   severity=severity, explanation="test finding", first_seen=first_seen or now, last_seen=now,
                   cleared=cleared)


def publish(producer: Any, f: Finding) -> float:
    t = time.time()
    producer.send("findings", key=f.id.encode(), value=f.encode())
    producer.flush()
    return t


def deliveries_for(webhook: WebhookReceiver, path: str, label: str, value: str) -> list[Any]:
    return [d for d in webhook.at(path)
            if any(a["labels"].get(label) == value for a in d.body.get("alerts", []))]


def am_alerts(am: ManagedProcess, **labels: str) -> list[dict[str, Any]]:
    flt = [f'{k}="{v}"' for k, v in labels.items()]
    r = requests.get(f"{am_url(am)}/api/v2/alerts", params={"filter": flt}, timeout=5)
    r.raise_for_status()
    return r.json()


@pytest.fixture(scope="module")
def actuator(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, producer: Any,
             test_alertmanager: ManagedProcess) -> Iterator[tuple[ManagedProcess, int]]:
    proc, port = start_actuator(tmp_path_factory.mktemp("paging"), kafka_bootstrap, am_url(test_alertmanager))
    try:
        yield proc, port
    finally:
        proc.stop()


def firing_sent(port: int) -> float:
    return scrape_metric(port, "opsloop_paging_alerts_sent_total", {"state": "firing"}) or 0.0


def test_finding_pages_once_and_resolves(actuator, producer, webhook: WebhookReceiver, test_alertmanager,
                                         kafka_bootstrap: str, capsys) -> None:
    proc, port = actuator
    hv = unique("hv")
    where = {"hypervisor": hv, "vm": "web-1", "port": "p1"}
    opened = make_finding("firewall.unprotected_port", where)
    t_publish = publish(producer, opened)

    pages = wait_until(lambda: deliveries_for(webhook, "/page", "hypervisor", hv), timeout=60, what="page at webhook")
    page = pages[0]
    assert page.body["status"] == "firing" and page.body["receiver"] == "page"
    alert = page.body["alerts"][0]
    assert alert["labels"] == {"alertname": "FirewallUnprotectedPort", "severity": "critical", "signal": "firewall",
                               "detector": "firewall.unprotected_port", "source": "opsloop-paging",
                               "hypervisor": hv, "vm": "web-1", "port": "p1"}
    ann = alert["annotations"]
    assert ann["summary"].endswith("observed chain absent, expected chain present")
    assert ann["description"].startswith("Observed: chain absent. Expected: chain present.")
    assert ann["runbook_url"].startswith("https://") and ann["dashboard_url"].startswith("http")
    assert ann["finding_id"] == opened.id
    # PagerDuty Events v2: the routing key came from the file, never from argv or the config text.
    pd = wait_until(lambda: [d for d in webhook.at("/pagerduty") if hv in json.dumps(d.body)], timeout=30,
                    what="PagerDuty event")
    assert pd[0].body["event_action"] == "trigger" and pd[0].body["routing_key"] == ROUTING_KEY
    assert pd[0].body["payload"]["severity"] == "critical"
    assert {link["text"] for link in pd[0].body["links"]} == {"dashboard", "runbook"}
    latency = page.received - t_publish
    with capsys.disabled():
        print(f"\n[paging e2e] finding published -> page at webhook: {latency:.2f} s "
              f"(Alertmanager group_wait 1 s in this test; 10 s for critical in production)")

    # Re-publish the same finding three times and let the actuator re-send it three times:
    # Alertmanager must see one alert and send no second page.
    sent_before = firing_sent(port)
    for _ in range(3):
        publish(producer, make_finding("firewall.unprotected_port", where, first_seen=opened.first_seen,
                                       observed="chain still absent"))
    wait_until(lambda: firing_sent(port) >= sent_before + 3, timeout=60, what="three re-sends")
    assert len(am_alerts(test_alertmanager, hypervisor=hv)) == 1
    active = am_alerts(test_alertmanager, hypervisor=hv)[0]
    assert datetime.fromisoformat(active["endsAt"].replace("Z", "+00:00")) > datetime.now(timezone.utc)
    assert len([d for d in deliveries_for(webhook, "/page", "hypervisor", hv) if d.body["status"] == "firing"]) == 1
    assert len([d for d in webhook.at("/pagerduty") if hv in json.dumps(d.body)]) == 1

    # Cleared: the resolve is delivered to both receivers (send_resolved: true).
    publish(producer, make_finding("firewall.unprotected_port", where, first_seen=opened.first_seen, cleared=True))
    resolved = wait_until(lambda: [d for d in deliveries_for(webhook, "/page", "hypervisor", hv)
                                   if d.body["status"] == "resolved"], timeout=60, what="resolve at webhook")
    assert resolved[0].body["alerts"][0]["labels"]["hypervisor"] == hv
    pd_events = wait_until(lambda: (e := [d.body for d in webhook.at("/pagerduty") if hv in json.dumps(d.body)])
                           and len(e) == 2 and e, timeout=30, what="PagerDuty resolve")
    assert [e["event_action"] for e in pd_events] == ["trigger", "resolve"]
    assert pd_events[0]["dedup_key"] == pd_events[1]["dedup_key"]

    # Audit trail: one record per action, keyed by the finding id.
    def audit() -> list[str]:
        docs = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, "audit")]
        return [d["action"] for d in docs if d.get("labels", {}).get("finding_id") == opened.id]

    actions = wait_until(lambda: (a := audit()) and "page_resolved" in a and a, timeout=30, what="audit records")
    assert actions == ["page_opened", "page_delivered", "page_resolved"]
    assert proc.running()


def test_a_finding_stamped_outside_1970_to_9999_is_dead_lettered_and_paging_goes_on(
        actuator, producer, webhook: WebhookReceiver, kafka_bootstrap: str) -> None:
    """Through the broker: the record is refused at decode (naming the field), dead-lettered and counted, its
    offset committed like any other; the finding published after it pages."""
    proc, port = actuator
    bad_hv, good_hv = unique("hv-stamped"), unique("hv-after")
    bad = orjson.loads(make_finding("firewall.unprotected_port", {"hypervisor": bad_hv, "vm": "web-1"}).encode())
    bad["first_seen"] = -6e10   # the year 68
    rejected = scrape_metric(port, "opsloop_paging_rejected_records_total") or 0.0
    producer.send("findings", key=bad["id"].encode(), value=orjson.dumps(bad))
    publish(producer, make_finding("firewall.unprotected_port", {"hypervisor": good_hv, "vm": "web-1"}))
    wait_until(lambda: deliveries_for(webhook, "/page", "hypervisor", good_hv), timeout=60, what="the page after it")
    assert (scrape_metric(port, "opsloop_paging_rejected_records_total") or 0.0) - rejected == 1
    dls = wait_until(lambda: [d for r in read_topic(kafka_bootstrap, "telemetry.deadletter")
                              if bad_hv in (d := orjson.loads(r.value)).get("value", "")],
                     timeout=30, what="the dead letter")
    assert len(dls) == 1 and dls[0]["stage"] == "paging" and dls[0]["source_topic"] == "findings"
    assert dls[0]["reason"].startswith("finding: first_seen: before 1970")
    assert not deliveries_for(webhook, "/page", "hypervisor", bad_hv) and proc.running()


def test_hypervisor_down_inhibits_its_firewall_alerts(actuator, producer, webhook, test_alertmanager) -> None:
    proc, port = actuator
    hv = unique("hv-down")
    now = datetime.now(timezone.utc)
    down = [{"labels": {"alertname": "HypervisorDown", "severity": "critical", "signal": "hypervisor",
                        "hypervisor": hv},
             "annotations": {"summary": f"hypervisor {hv} is down"},
             "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=10)).isoformat()}]
    requests.post(f"{am_url(test_alertmanager)}/api/v2/alerts", json=down, timeout=5).raise_for_status()
    publish(producer, make_finding("firewall.unprotected_port", {"hypervisor": hv, "vm": "db-1", "port": "p7"}))

    def inhibited() -> bool:
        alerts = am_alerts(test_alertmanager, hypervisor=hv, alertname="FirewallUnprotectedPort")
        return bool(alerts) and bool(alerts[0]["status"]["inhibitedBy"])

    wait_until(inhibited, timeout=60, what="firewall alert inhibited by HypervisorDown")
    wait_until(lambda: deliveries_for(webhook, "/page", "hypervisor", hv), timeout=30, what="HypervisorDown page")
    sent = firing_sent(port)
    wait_until(lambda: firing_sent(port) >= sent + 2, timeout=60, what="two more re-sends")
    paged = {a["labels"]["alertname"] for d in deliveries_for(webhook, "/page", "hypervisor", hv)
             for a in d.body["alerts"]}
    assert paged == {"HypervisorDown"}


def test_a_critical_alert_inhibits_the_warning_of_the_same_thing_only(test_alertmanager) -> None:
    """The critical variant silences its warning for the same thing, and "the same thing" includes the findings'
    where-labels: before, a critical alert on one VM inhibited the warning of the same name on another VM of the
    same hypervisor (the rule's `equal` named the hypervisor, not the VM), and that warning never reached anyone."""
    hv = unique("hv-sev")
    now = datetime.now(timezone.utc)

    def alert(severity: str, vm: str) -> dict[str, Any]:
        return {"labels": {"alertname": "FirewallUnprotectedPort", "severity": severity, "signal": "firewall",
                           "hypervisor": hv, "vm": vm, "port": "p1"},
                "annotations": {"summary": f"{vm} on {hv}"},
                "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=10)).isoformat()}

    alerts = [alert("critical", "web-1"), alert("warning", "web-1"), alert("warning", "db-2")]
    requests.post(f"{am_url(test_alertmanager)}/api/v2/alerts", json=alerts, timeout=5).raise_for_status()

    def inhibited(vm: str) -> bool | None:
        found = am_alerts(test_alertmanager, hypervisor=hv, vm=vm, severity="warning")
        return bool(found[0]["status"]["inhibitedBy"]) if found else None

    wait_until(lambda: inhibited("web-1"), timeout=30, what="the warning of the critical's own VM inhibited")
    assert inhibited("db-2") is False


def test_keystone_findings_are_muted_in_the_accounting_window(actuator, producer, webhook, test_alertmanager) -> None:
    proc, port = actuator
    host, target_set = unique("ks"), unique("vm6")
    publish(producer, make_finding("keystone.latency_regime", {"host": host}, severity=Severity.WARNING,
                                   observed=650.0))
    publish(producer, make_finding("netperf.throughput_drop", {"target_set": target_set, "label": "q8"},
                                   severity=Severity.WARNING, observed=3.5))
    # The netperf warning (same route shape, same timings) reaches the ticket receiver ...
    wait_until(lambda: deliveries_for(webhook, "/ticket", "target_set", target_set), timeout=60,
               what="netperf warning at the ticket webhook")
    # ... the Keystone one is in Alertmanager, not inhibited or silenced, and still never notifies.
    ks = wait_until(lambda: am_alerts(test_alertmanager, host=host), timeout=30, what="keystone alert in AM")
    assert ks[0]["status"]["state"] == "active"
    sent = firing_sent(port)
    wait_until(lambda: firing_sent(port) >= sent + 2, timeout=60, what="two more re-sends")
    assert deliveries_for(webhook, "/ticket", "host", host) == []


def test_example_silences_are_accepted(test_alertmanager) -> None:
    now = datetime.now(timezone.utc)
    for path in sorted((REPO / "alerts" / "silences").glob("*.json")):
        silence = json.loads(path.read_text())
        silence.update(startsAt=now.isoformat(), endsAt=(now + timedelta(hours=1)).isoformat())
        r = requests.post(f"{am_url(test_alertmanager)}/api/v2/silences", json=silence, timeout=5)
        assert r.status_code == 200, f"{path.name}: {r.text}"
        sid = r.json()["silenceID"]
        got = requests.get(f"{am_url(test_alertmanager)}/api/v2/silence/{sid}", timeout=5).json()
        assert got["status"]["state"] == "active"
        assert {m["name"] for m in got["matchers"]} == {m["name"] for m in silence["matchers"]}
        requests.delete(f"{am_url(test_alertmanager)}/api/v2/silence/{sid}", timeout=5).raise_for_status()


def test_alertmanager_outage_is_retried_with_backoff(tmp_path: Path, kafka_bootstrap: str, producer) -> None:
    # Its own receiver: the module's actuator also sees this finding and pages via the module's Alertmanager.
    with webhook_receiver() as webhook:
        outage_and_restart(tmp_path, kafka_bootstrap, producer, webhook)


def outage_and_restart(tmp_path: Path, kafka_bootstrap: str, producer: Any, webhook: WebhookReceiver) -> None:
    am_port = free_port()  # nothing listens here yet
    proc, port = start_actuator(tmp_path / "paging", kafka_bootstrap, f"http://127.0.0.1:{am_port}")
    am = None
    try:
        hv = unique("hv-outage")
        publish(producer, make_finding("firewall.unprotected_port", {"hypervisor": hv, "vm": "x", "port": "p"}))
        wait_until(lambda: (scrape_metric(port, "opsloop_paging_delivery_failures_total") or 0) >= 2
                   and (scrape_metric(port, "opsloop_paging_pending_alerts") or 0) >= 1,
                   timeout=90, what="failed deliveries while Alertmanager is down")
        assert proc.running()
        am = start_alertmanager(tmp_path / "am", webhook, port=am_port)
        wait_until(lambda: deliveries_for(webhook, "/page", "hypervisor", hv), timeout=60,
                   what="page once Alertmanager is up")
        wait_until(lambda: scrape_metric(port, "opsloop_paging_pending_alerts") == 0, timeout=30,
                   what="nothing pending")
        # Restart the actuator (SIGKILL): its state file keeps the alert; the re-send is no new page.
        proc.kill()
        proc, port = start_actuator(tmp_path / "paging", kafka_bootstrap, f"http://127.0.0.1:{am_port}",
                                    group_id=unique("opsloop-paging-test"))
        wait_until(lambda: firing_sent(port) >= 2, timeout=60, what="re-sends after restart")
        firing = [d for d in deliveries_for(webhook, "/page", "hypervisor", hv) if d.body["status"] == "firing"]
        assert len(firing) == 1, [(d.received, d.body) for d in firing]
        assert (scrape_metric(port, "opsloop_paging_active_alerts") or 0) >= 1
    finally:
        proc.stop()
        if am is not None:
            am.stop()
