"""The paging actuator's alert of a finding mutes the rule backstop (alerts/rules/signals.yml, ``backstop="true"``)
of that same finding only: the real Alertmanager with alerts/alertmanager.yml (tests/alerting.py renders it).

Before, the inhibition's ``equal`` named only signal, hypervisor, host and target_set. An actuator alert without
those three (an anomaly series, a keystone credential) muted ``OpsloopCriticalFinding`` of every detector of its
signal, and any paged finding of a hypervisor (a drift ticket) muted its ``FirewallVmPortsUnprotected``: the
backstop stayed quiet for findings whose own page was lost, the one case it is there for.

The actuator's alerts are built by the actuator's own mapping (``labels_for``), the backstops' labels from the
labels the stream worker exports (``finding_labels``) as the rules keep them (pinned by signals_test.yml).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import requests

from opsloop.controllers.paging.mapping import labels_for, signal_for
from opsloop.records import Finding, Severity
from opsloop.stack import ManagedProcess
from opsloop.streams.agents.findings_sink import finding_labels
from tests.alerting import WebhookReceiver, am_url
from tests.helpers import unique, wait_until

pytestmark = pytest.mark.integration


def finding(detector: str, where: dict[str, str], severity: Severity = Severity.CRITICAL) -> Finding:
    now = time.time()
    return Finding(detector=detector, what=f"{detector} finding", where=where, observed=1.0, expected=0.0,
                   severity=severity, explanation="test finding", first_seen=now, last_seen=now)


def alert(labels: dict[str, str]) -> dict[str, Any]:
    now = datetime.now(timezone.utc)
    return {"labels": labels, "annotations": {"summary": "test"},
            "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=10)).isoformat()}


def actuator_alert(f: Finding) -> dict[str, Any]:
    return alert(labels_for(f))


def critical_finding_backstop(f: Finding) -> dict[str, Any]:
    """OpsloopCriticalFinding of ``f``: its exported labels without the finding id, the rule's own labels."""
    labels = {k: v for k, v in finding_labels(f).items() if k != "id"}
    return alert({**labels, "alertname": "OpsloopCriticalFinding", "severity": "critical", "backstop": "true",
                  "signal": signal_for(f.detector)})


def place_backstop(alertname: str, severity: str, signal: str, **labels: str) -> dict[str, Any]:
    return alert({"alertname": alertname, "severity": severity, "signal": signal, "backstop": "true", **labels})


def post(am: ManagedProcess, alerts: list[dict[str, Any]]) -> None:
    requests.post(f"{am_url(am)}/api/v2/alerts", json=alerts, timeout=5).raise_for_status()


def inhibited_by(am: ManagedProcess, labels: dict[str, str]) -> list[str] | None:
    """The inhibitedBy of the alert with exactly ``labels`` (None while Alertmanager does not have it)."""
    r = requests.get(f"{am_url(am)}/api/v2/alerts", params={"filter": [f'{k}="{v}"' for k, v in labels.items()]},
                     timeout=5)
    r.raise_for_status()
    found = [a for a in r.json() if a["labels"] == labels]
    return found[0]["status"]["inhibitedBy"] if found else None


def delivered(webhook: WebhookReceiver, path: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """The notification bodies at ``path`` that carry the alert with exactly ``labels``."""
    return [d.body for d in webhook.at(path) if any(a["labels"] == labels for a in d.body.get("alerts", []))]


def test_a_page_mutes_the_critical_finding_backstop_of_its_own_finding_not_its_whole_signal(
        test_alertmanager: ManagedProcess, webhook: WebhookReceiver) -> None:
    # anomaly findings have none of hypervisor/host/target_set: the old rule compared nothing but the signal
    paged = finding(f"anomaly.haproxy_{unique('d')[2:]}", {"metric": "haproxy", "field": "rate", "proxy": "web",
                                                           "sv": unique("sv")})
    sibling = finding(paged.detector, {**paged.where, "sv": unique("sv")})         # another series, same detector
    other = finding(f"anomaly.ipvs_{unique('d')[2:]}", {"metric": "ipvs", "field": "conns",
                                                        "service": unique("svc")})  # another detector, same signal
    post(test_alertmanager, [actuator_alert(paged)])
    backstops = {name: critical_finding_backstop(f) for name, f in
                 (("paged", paged), ("sibling", sibling), ("other", other))}
    post(test_alertmanager, list(backstops.values()))
    labels = {name: b["labels"] for name, b in backstops.items()}

    wait_until(lambda: inhibited_by(test_alertmanager, labels["paged"]), timeout=30,
               what="the paged finding's own backstop inhibited")
    # the inhibitor holds the actuator's alert now: what it does not mute at this point, it does not mute
    assert inhibited_by(test_alertmanager, labels["sibling"]) == []
    assert inhibited_by(test_alertmanager, labels["other"]) == []
    # ... and those backstops page; the paged finding's backstop (same group as its sibling) is not in the page
    page = wait_until(lambda: delivered(webhook, "/page", labels["sibling"]), timeout=30,
                      what="the sibling's backstop paged")
    assert all(a["labels"] != labels["paged"] for body in page for a in body["alerts"])
    wait_until(lambda: delivered(webhook, "/page", labels["other"]), timeout=30, what="other detector's backstop page")
    assert not delivered(webhook, "/page", labels["paged"])


def test_a_page_of_one_detector_does_not_mute_another_detectors_backstop_of_the_same_place(
        test_alertmanager: ManagedProcess, webhook: WebhookReceiver) -> None:
    """A drift ticket of a hypervisor muted the critical unprotected-port backstop of that hypervisor."""
    hv_drift, hv_port = unique("hv-drift"), unique("hv-port")
    drift = finding("firewall.ruleset_drift", {"hypervisor": hv_drift, "role": "compute"}, Severity.WARNING)
    port = finding("firewall.unprotected_port", {"hypervisor": hv_port, "vm": "web-1", "port": "p1"})
    post(test_alertmanager, [actuator_alert(drift), actuator_alert(port)])
    unprotected = {hv: place_backstop("FirewallVmPortsUnprotected", "critical", "firewall", hypervisor=hv,
                                      detector="firewall.unprotected_port") for hv in (hv_drift, hv_port)}
    drifts = {det: place_backstop("FirewallDrift", "warning", "firewall", hypervisor=hv_drift, detector=det)
              for det in ("firewall.ruleset_drift", "firewall.package_drift")}
    post(test_alertmanager, [*unprotected.values(), *drifts.values()])

    wait_until(lambda: inhibited_by(test_alertmanager, unprotected[hv_port]["labels"]), timeout=30,
               what="the unprotected-port backstop of the paged hypervisor inhibited")
    wait_until(lambda: inhibited_by(test_alertmanager, drifts["firewall.ruleset_drift"]["labels"]), timeout=30,
               what="the ruleset-drift backstop of the ticketed hypervisor inhibited")
    assert inhibited_by(test_alertmanager, unprotected[hv_drift]["labels"]) == []
    assert inhibited_by(test_alertmanager, drifts["firewall.package_drift"]["labels"]) == []
    wait_until(lambda: delivered(webhook, "/page", unprotected[hv_drift]["labels"]), timeout=30,
               what="the unprotected-port backstop of the drifting hypervisor paged")
    tickets = wait_until(lambda: delivered(webhook, "/ticket", drifts["firewall.package_drift"]["labels"]),
                         timeout=30, what="the package-drift backstop ticketed")
    assert all(a["labels"] != drifts["firewall.ruleset_drift"]["labels"] for body in tickets for a in body["alerts"])
