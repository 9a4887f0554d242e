"""The README's demo through the real pipeline, with the lab's anomaly settings (what `make run` uses):

simulated BMC (OpenIPMI ipmi_sim) at a flat 248 W → ``opsloop collect ipmi`` (real ipmitool) → Kafka →
``opsloop stream worker`` (general anomaly detector on ``ipmi_power.watts``) → ``findings`` → paging
actuator → Alertmanager (our rendered config) → webhook receiver. Writing 600 W must page (one alert for
the one event, however long the draw stays up) and writing 248 W back must resolve it.

One BMC alone: the generation-deviation finding needs three servers of a generation, so the page here can
only come from the anomaly detector. The sample-to-page time is printed; nothing asserts on it.
"""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from opsloop.lab.bmcsim import BMCFleet, BMCSpec
from opsloop.lab.pipeline import LAB_ANOMALY
from opsloop.stack import Stack, free_port
from tests.alerting import am_url, ensure_topics, start_actuator, start_alertmanager, webhook_receiver
from tests.e2e.pipeline import pipeline_config, start_collector, start_worker
from tests.e2e.test_paging_paths import alerts_delivered, report, sample_to_page_s
from tests.helpers import wait_until, write_config

pytestmark = pytest.mark.integration

FLAT_WATTS = 248
JUMP_WATTS = 600


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[tuple[BMCFleet, str]]:
    name = f"stor-g1-{uuid.uuid4().hex[:6]}"
    with BMCFleet([BMCSpec(name, watts=FLAT_WATTS)], tmp_path / "bmcs") as fleet:
        yield fleet, name


def test_bmc_power_jump_opens_an_anomaly_page_and_the_return_resolves_it(
        stack: Stack, bmc: tuple[BMCFleet, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet, host = bmc
    ensure_topics(stack.kafka_bootstrap, "findings", "audit")
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(fleet.inventory({host: {"generation": "gen1"}})))
    with webhook_receiver() as webhook:
        am = start_alertmanager(tmp_path / "am", webhook)
        actuator, _ = start_actuator(tmp_path / "paging", stack.kafka_bootstrap, am_url(am))
        config, doc = pipeline_config(tmp_path, stack, {"ipmi": {"inventory": str(tmp_path / "inventory.yaml"),
                                                                 "timeout_s": 8}})
        doc["streams"] = {"detectors": {"anomaly": LAB_ANOMALY}}
        write_config(config, doc)
        worker = start_worker(tmp_path, config, doc, stack)
        cdoc: dict[str, Any] = {**doc, "collector": {**doc["collector"], "metrics_port": free_port()}}
        ccfg = write_config(tmp_path / "collector.yaml", cdoc)
        collector = start_collector("ipmi", tmp_path, ccfg, cdoc, stack)
        wport = doc["stream"]["metrics_port"]
        labels = {"metric": "ipmi_power", "field": "watts"}
        try:
            # Warm: the detector's band is drawn around the flat reading (the upper edge is a gauge).
            wait_until(lambda: _series_gauge(wport, "opsloop_anomaly_upper", labels, host), timeout=180,
                       what="the anomaly band of the BMC's watts")
            assert alerts_delivered(webhook, "firing", host=host) == []

            fleet[host].set_watts(JUMP_WATTS)
            fired = wait_until(lambda: alerts_delivered(webhook, "firing", host=host), timeout=120,
                               what="anomaly page at the webhook after the power jump")
            received, alert = fired[0]
            assert alert["labels"]["alertname"] == "AnomalyIpmiPowerWatts", alert["labels"]
            assert alert["labels"]["detector"] == "anomaly.ipmi_power.watts"
            assert float(alert["annotations"]["observed"]) == pytest.approx(JUMP_WATTS, abs=2)
            assert "expected" in alert["annotations"]["explanation"]
            report(capsys, "BMC power jump (anomaly detector)", sample_to_page_s(received, alert))
            # The draw stays up: the detector re-anchors its level on 600 W (several more samples
            # scored) and the alert stays open - no resolve, no second page.
            wait_until(lambda: (_series_gauge(wport, "opsloop_anomaly_expected", labels, host) or 0) > 500,
                       timeout=90, what="the detector's expected value following the new level")
            assert alerts_delivered(webhook, "resolved", host=host) == []

            fleet[host].set_watts(FLAT_WATTS)
            resolved = wait_until(lambda: alerts_delivered(webhook, "resolved", host=host), timeout=180,
                                  what="resolve at the webhook after the draw went back")
            assert resolved[0][1]["labels"]["alertname"] == "AnomalyIpmiPowerWatts"
            assert len(alerts_delivered(webhook, "firing", host=host)) == 1     # one page for one problem
            assert actuator.running() and collector.running() and worker.running()
        finally:
            collector.stop()
            worker.stop()
            actuator.stop()
            am.stop()


def _series_gauge(port: int, name: str, labels: dict[str, str], host: str) -> float | None:
    """The gauge of the one series whose tags name ``host`` (the series label is the sorted tag set)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()) \
                    and f"host={host}" in s.labels.get("series", ""):
                return s.value
    return None
