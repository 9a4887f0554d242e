"""Two paging paths end to end, every stage a real component:

(a) simulated BMC (OpenIPMI ipmi_sim) power jump → ``opsloop collect ipmi`` (real ipmitool) → Kafka →
    ``opsloop stream worker`` (power detector: generation deviation) → ``findings`` → paging actuator →
    Alertmanager (our rendered config) → webhook receiver; the resolve when the draw goes back.
(b) a VM's security-group chain deleted in a network namespace "hypervisor" → ``opsloop collect iptables``
    (real iptables-save) → worker (firewall detector, critical) → ... → page; the resolve when restored.

The time from the sample (its event timestamp, set by the collector round; the finding carries it as
``first_seen``) to the page at the webhook is printed. Nothing here asserts on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from opsloop.lab.bmcsim import BMCFleet, BMCSpec
from opsloop.collectors.iptables.neutron_layout import LayoutPort, filter_table
from opsloop.stack import ManagedProcess, Stack, free_port
from tests.alerting import (WebhookReceiver, am_url, ensure_topics, start_actuator, start_alertmanager,
                                   webhook_receiver)
from tests.e2e.pipeline import pipeline_config, start_collector, start_worker
from tests.helpers import scrape_metric, unique, wait_until, write_config

pytestmark = pytest.mark.integration

GEN3_WATTS = (155, 156, 154)   # "(Ceph) storage (server) power usage": a gen3 server draws ~155 W under light load
JUMP_WATTS = 248               # ... and the jump to a gen1-like draw


# ------------------------------------------------------------------------------------------ helpers
def alerts_delivered(webhook: WebhookReceiver, status: str, **labels: str) -> list[tuple[float, dict[str, Any]]]:
    """(receipt time, alert) of every alert with ``labels`` that Alertmanager delivered in a ``status`` post."""
    out = []
    for path in ("/page", "/ticket"):
        for d in webhook.at(path):
            if d.body.get("status") != status:
                continue
            for a in d.body.get("alerts", []):
                if a.get("status") == status and all(a["labels"].get(k) == v for k, v in labels.items()):
                    out.append((d.received, {**a, "receiver_path": path}))
    return out


def sample_to_page_s(received: float, alert: dict[str, Any]) -> float:
    """Webhook receipt minus the event time of the sample that opened the finding."""
    first_seen = datetime.fromisoformat(alert["annotations"]["first_seen"].replace("Z", "+00:00")).timestamp()
    return received - first_seen


def report(capsys: pytest.CaptureFixture[str], path: str, latency_s: float) -> None:
    with capsys.disabled():
        print(f"\n[paging paths] {path}: sample -> page at webhook {latency_s:.2f} s "
              "(Alertmanager group_wait 1 s in this test)")


@dataclass
class Paging:
    webhook: WebhookReceiver
    alertmanager: ManagedProcess
    actuator: ManagedProcess
    actuator_port: int
    stack: Stack
    worker_config: dict[str, Any]


@pytest.fixture(scope="module")
def paging(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Paging]:
    """Webhook ← Alertmanager ← paging actuator ← findings ← one stream worker, shared by both paths."""
    tmp = tmp_path_factory.mktemp("paging-paths")
    ensure_topics(stack.kafka_bootstrap, "findings", "audit")
    with webhook_receiver() as webhook:
        am = start_alertmanager(tmp / "am", webhook)
        actuator, port = start_actuator(tmp / "paging", stack.kafka_bootstrap, am_url(am))
        config, doc = pipeline_config(tmp, stack)
        doc.setdefault("streams", {})["detectors"] = {"anomaly": {"enabled": False}}
        write_config(config, doc)
        worker = start_worker(tmp, config, doc, stack)
        try:
            yield Paging(webhook, am, actuator, port, stack, doc)
        finally:
            worker.stop()
            actuator.stop()
            am.stop()


def collector_config(tmp: Path, paging: Paging, collectors: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The worker's config with this collector's section and its own metrics port."""
    doc = json.loads(json.dumps(paging.worker_config))
    doc["collector"] = {**doc["collector"], "metrics_port": free_port(), "spool_dir": str(tmp / "spool"),
                        "interval_s": 1.0}
    doc["collectors"] = collectors
    return write_config(tmp / "collector.yaml", doc), doc


# ------------------------------------------------------------------------------------- (a) power
@pytest.fixture
def gen3_fleet(tmp_path: Path) -> Iterator[tuple[BMCFleet, list[str]]]:
    run = uuid.uuid4().hex[:6]
    names = [f"stor-g3-{run}-{i}" for i in range(len(GEN3_WATTS))]
    with BMCFleet([BMCSpec(n, watts=w) for n, w in zip(names, GEN3_WATTS)], tmp_path / "bmcs") as fleet:
        yield fleet, names


def test_bmc_power_jump_pages_and_resolves(paging: Paging, gen3_fleet, tmp_path: Path, capsys) -> None:
    fleet, names = gen3_fleet
    victim = names[0]
    inventory = fleet.inventory({n: {"generation": "gen3", "raw_capacity_tb": 96, "role": "ceph-osd"}
                                 for n in names})
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inventory))
    config, doc = collector_config(tmp_path, paging, {"ipmi": {"inventory": str(tmp_path / "inventory.yaml"),
                                                               "timeout_s": 8}})
    collector = start_collector("ipmi", tmp_path, config, doc, paging.stack)
    wport = paging.worker_config["stream"]["metrics_port"]
    try:
        # Warm-up: every host's smoothed draw is in the worker, near its set value.
        for name, watts in zip(names, GEN3_WATTS):
            got = wait_until(lambda n=name: scrape_metric(wport, "opsloop_power_watts", {"host": n}), timeout=90,
                             what=f"power gauge of {name}")
            assert got == pytest.approx(watts, abs=2)
        assert alerts_delivered(paging.webhook, "firing", host=victim) == []

        fleet[victim].set_watts(JUMP_WATTS)
        fired = wait_until(lambda: alerts_delivered(paging.webhook, "firing", host=victim), timeout=120,
                           what="power deviation page at the webhook")
        received, alert = fired[0]
        assert alert["labels"]["alertname"] == "PowerGenerationDeviation", alert["labels"]
        assert alert["labels"]["severity"] == "warning" and alert["receiver_path"] == "/ticket"
        assert alert["labels"]["source"] == "opsloop-paging" and alert["labels"]["generation"] == "gen3"
        # Only the host that jumped; its generation peers stay quiet.
        assert all(alerts_delivered(paging.webhook, "firing", host=n) == [] for n in names[1:])
        report(capsys, "BMC power jump (ipmi)", sample_to_page_s(received, alert))

        fleet[victim].set_watts(GEN3_WATTS[0])
        resolved = wait_until(lambda: alerts_delivered(paging.webhook, "resolved", host=victim), timeout=180,
                              what="resolve at the webhook after the draw went back")
        assert resolved[0][1]["labels"]["alertname"] == "PowerGenerationDeviation"
        assert len(alerts_delivered(paging.webhook, "firing", host=victim)) == 1   # one page for one problem
        assert paging.actuator.running() and collector.running()
    finally:
        collector.stop()


# ----------------------------------------------------------------------------------- (b) firewall
def _sh(*argv: str, stdin: str | None = None) -> str:
    res = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise RuntimeError(f"{argv} failed: {res.stderr}")
    return res.stdout


@pytest.fixture
def hypervisor(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A network namespace with two tap devices and Neutron's iptables layout for them (nft backend)."""
    netns = f"opsl-hv-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    host = unique("hypervisor")
    _sh("ip", "netns", "add", netns)
    try:
        ports = []
        for i in range(2):
            pid = str(uuid.uuid4())
            ports.append(LayoutPort(pid, f"10.9.0.{i + 10}", f"fa:16:3e:09:00:{i:02x}"))
            _sh("ip", "netns", "exec", netns, "ip", "tuntap", "add", "dev", f"tap{pid[:11]}", "mode", "tap")
        ports_file = tmp_path / "ports.json"
        ports_file.write_text(json.dumps([{"port_id": p.port_id, "vm": f"vm{i}", "tenant": "acme"}
                                          for i, p in enumerate(ports)]))
        _sh("ip", "netns", "exec", netns, "iptables-nft-restore", stdin=filter_table(ports))
        _sh("ip", "netns", "exec", netns, "ip6tables-nft-restore", stdin=filter_table(ports, family="ipv6"))
        yield {"host": host, "netns": netns, "ports": ports, "ports_file": ports_file}
    finally:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)


def test_deleted_chain_pages_and_restore_resolves(paging: Paging, hypervisor, tmp_path: Path, capsys) -> None:
    hv, netns = hypervisor["host"], hypervisor["netns"]
    config, doc = collector_config(tmp_path, paging, {"iptables": {"backend": "nft", "targets": [
        {"host": hv, "netns": netns, "ports_file": str(hypervisor["ports_file"])}]}})
    collector = start_collector("iptables", tmp_path, config, doc, paging.stack)
    wport = paging.worker_config["stream"]["metrics_port"]
    try:
        wait_until(lambda: scrape_metric(wport, "opsloop_firewall_ports", {"hypervisor": hv, "state": "protected"})
                   == 2.0, timeout=90, what="both ports protected in the worker")
        intact = _sh("ip", "netns", "exec", netns, "iptables-nft-save")

        # The incident: the agent drops one VM's security-group chains and every rule naming them.
        victim = hypervisor["ports"][0].port_id
        short, tap = victim[:10], f"tap{victim[:11]}"
        kept = [line for line in intact.splitlines() if short not in line and tap not in line]
        _sh("ip", "netns", "exec", netns, "iptables-nft-restore", stdin="\n".join(kept) + "\n")

        # Filtered by alert name: the same change also opens a ruleset-drift finding (a ticket) on this
        # hypervisor, and which of the two reaches the webhook first is a race.
        page = {"hypervisor": hv, "alertname": "FirewallUnprotectedPort"}
        fired = wait_until(lambda: alerts_delivered(paging.webhook, "firing", **page), timeout=90,
                           what="firewall page at the webhook")
        received, alert = fired[0]
        assert alert["receiver_path"] == "/page"
        assert alert["labels"]["alertname"] == "FirewallUnprotectedPort" and alert["labels"]["severity"] == "critical"
        assert alert["labels"]["port"] == victim and alert["labels"]["vm"] == "vm0"
        report(capsys, "deleted firewall chain (iptables)", sample_to_page_s(received, alert))

        _sh("ip", "netns", "exec", netns, "iptables-nft-restore", stdin=intact)
        resolved = wait_until(lambda: alerts_delivered(paging.webhook, "resolved", **page), timeout=90,
                              what="resolve at the webhook after the chain was restored")
        assert resolved[0][1]["labels"]["port"] == victim
        assert len(alerts_delivered(paging.webhook, "firing", **page)) == 1
        assert scrape_metric(wport, "opsloop_firewall_ports", {"hypervisor": hv, "state": "unprotected"}) == 0.0
    finally:
        collector.stop()
