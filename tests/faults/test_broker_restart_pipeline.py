"""The running pipeline across a broker restart: every long-running service carries on without being restarted.

The session's single broker is stopped for ~40 s and started again on the same data while these real processes
run: HAProxy edge + traffic, `opsloop collect haproxy`, `opsloop stream worker`, the edge control service, the
HAProxy weight actuator, the paging actuator → Alertmanager → webhook. During the outage every service's
/metrics keeps answering. Afterwards, within bounded waits: a firewall round published just before the stop
and one published after the restart are both processed (their findings on the topic, their pages at the
webhook, the worker's committed offsets past them); the edge controller decides again on fresh demand, a
health change gives a new version and the actuator applies it in HAProxy; no process exited.

The outage is said, not shouted: the worker's Kafka client (aiokafka) logged every retry, ~120 lines a second
(~5,000 for this outage, most at error level); now each is counted in
``opsloop_kafka_client_log_lines_total`` and logged once a minute per kind
(``opsloop.log.ClientLogLimiter``, on the worker's log handler). Old code: the log-flood assertion fails (and the
counter is missing).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import orjson
from kafka import KafkaAdminClient, KafkaProducer
from prometheus_client import REGISTRY

from opsloop.lab.traffic import TrafficGenerator
from opsloop.lb.haproxy import HaproxyAPI
from opsloop.log import ClientLogLimiter
from opsloop.topics import Topic
from tests.alerting import am_url, ensure_topics, start_actuator, start_alertmanager, webhook_receiver
from tests.e2e.pipeline import (BACKEND, EdgeControl, applied, loop_config, start_collector, start_weight_actuator,
                                start_worker, stop_all)
from tests.e2e.test_paging_paths import alerts_delivered
from tests.helpers import metric_samples, metric_value, unique, wait_until
from tests.streams.agents.test_integration import findings_of, iptables_round

pytestmark = pytest.mark.integration

OUTAGE_S = 40
RATE = 80.0
NEAR_CAPACITY = 40.0
CLIENT_WARNINGS = "opsloop_kafka_client_log_lines_total"
# aiokafka log lines the worker may write in one outage: each kind (logger, level, message) once a minute,
# the outage spans one or two minutes; some ten kinds come up (the old code: ~5,000 lines)
MAX_CLIENT_LINES = 60


def send_round(bootstrap: str, hv: str) -> tuple[int, int]:
    """One iptables round of ``hv`` with an unprotected port; (partition, offset after it), acked by the broker."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        md = producer.send(Topic.IPTABLES.value, key=hv.encode(),
                           value=iptables_round(hv, time.time(), {"p-open": False, "p-safe": True})).get(timeout=30)
    finally:
        producer.close()
    return md.partition, md.offset + 1


def committed(bootstrap: str, group: str, partition: int) -> int:
    """The group's committed offset of telemetry.iptables ``partition`` on the broker (-1: none)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        found = admin.list_group_offsets({group: None})[group]
        return max((m.offset for tp, m in found.items()
                    if tp.topic == Topic.IPTABLES.value and tp.partition == partition), default=-1)
    finally:
        admin.close()


class Kept(logging.Handler):
    """Every record that passed the logger's filters."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def client_lines(log: Path) -> list[tuple[str, str]]:
    """(logger, event) of each line the Kafka client (aiokafka) wrote to a worker's log so far."""
    out = []
    for line in log.read_bytes().splitlines():
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict) and str(doc.get("logger", "")).startswith("aiokafka"):
            out.append((doc["logger"], str(doc.get("event", ""))[:60]))
    return out


def paged(webhook: Any, hv: str) -> bool:
    return bool(alerts_delivered(webhook, "firing", hypervisor=hv))


def test_every_service_carries_on_across_a_broker_restart(stack: Any, lab_edge: Any, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    ensure_topics(bootstrap, Topic.FINDINGS.value, Topic.IPTABLES.value, "audit")
    lab_edge.start(capacities={"near": NEAR_CAPACITY})
    loop = loop_config(tmp_path, stack, lab_edge.admin_socket, NEAR_CAPACITY)
    group = loop.doc["stream"]["app_id"]
    hap = HaproxyAPI(lab_edge.admin_socket)
    parts: list[Any] = []
    with webhook_receiver() as webhook:
        am = start_alertmanager(tmp_path / "am", webhook)
        parts.append(am)
        try:
            paging, paging_port = start_actuator(tmp_path / "paging", bootstrap, am_url(am))
            parts.append(paging)
            worker = start_worker(tmp_path, loop.config, loop.doc, stack)
            parts.append(worker)
            collector = start_collector("haproxy", tmp_path, loop.config, loop.doc, stack)
            parts.append(collector)
            ctl = EdgeControl(loop.config, tmp_path / "edge-control", loop.api_port, loop.token).start()
            parts.append(ctl)
            actuator = start_weight_actuator(tmp_path, loop, stack)
            parts.append(actuator)
            gen = TrafficGenerator(lab_edge.url, RATE, workers=8).start()
            parts.append(gen)
            procs = {"worker": worker, "collector": collector, "edge": ctl.proc, "actuator": actuator,
                     "paging": paging}
            ports = {"worker": loop.doc["stream"]["metrics_port"], "collector": loop.doc["collector"]["metrics_port"],
                     "edge": loop.edge_port, "actuator": loop.actuator_port, "paging": paging_port}

            # Before: the loop decides on live demand and HAProxy carries it; a firewall round pages.
            wait_until(lambda: ctl.status().get("mode") == "normal", timeout=180, interval=0.5,
                       what="the controller deciding on live demand")
            applied(hap, ctl, loop.lb)
            hv_warm = unique("hv-warm")
            send_round(bootstrap, hv_warm)
            wait_until(lambda: paged(webhook, hv_warm), timeout=120, what="the page of a round before the outage")

            # A round the broker acked just before it stops: recorded, so it must be processed (at-least-once).
            hv_before = unique("hv-before")
            before_partition, before_end = send_round(bootstrap, hv_before)
            lines_at_stop = len(client_lines(worker.logfile))
            warnings_at_stop = metric_value(metric_samples(ports["worker"]), CLIENT_WARNINGS) or 0
            stack.component("kafka").stop()
            version_at_stop = ctl.status()["version"]
            # During: every service's /metrics answers (the outage is seen there, not as a dead endpoint).
            deadline = time.monotonic() + OUTAGE_S
            scrapes = 0
            while time.monotonic() < deadline:
                for name, port in ports.items():
                    assert metric_samples(port), f"{name}: /metrics empty during the outage"
                    assert procs[name].running(), f"{name} exited during the outage:\n{procs[name].tail(30)}"
                scrapes += 1
                time.sleep(2)
            assert scrapes >= 5
            # the outage is a few lines of the worker's Kafka client, not one per retry, and a rate in /metrics
            during = client_lines(worker.logfile)[lines_at_stop:]
            assert during, "the worker said nothing of the outage"
            assert len(during) <= MAX_CLIENT_LINES, \
                f"{len(during)} Kafka client lines in {OUTAGE_S} s: {Counter(during).most_common(5)}"
            assert (metric_value(metric_samples(ports["worker"]), CLIENT_WARNINGS) or 0) > warnings_at_stop
            stack.start_component("kafka")

            # After: a new round is processed and pages; both rounds' offsets committed by the worker.
            hv_after = unique("hv-after")
            after_partition, after_end = wait_until(lambda: send_round(bootstrap, hv_after), timeout=120,
                                                    what="a round accepted by the restarted broker")
            for hv in (hv_before, hv_after):
                wait_until(lambda: findings_of(bootstrap, "firewall.unprotected_port", hypervisor=hv), timeout=180,
                           interval=2.0, what=f"the worker's finding for {hv}")
                wait_until(lambda: paged(webhook, hv), timeout=180, interval=1.0, what=f"the page for {hv}")
            wait_until(lambda: committed(bootstrap, group, before_partition) >= before_end
                       and committed(bootstrap, group, after_partition) >= after_end, timeout=120, interval=2.0,
                       what="the worker's commits past both rounds")

            # The edge loop: fresh demand decided on again, a health change is a new version applied in HAProxy.
            wait_until(lambda: ctl.status().get("mode") == "normal" and ctl.status().get("decision_age_s", 99) < 5,
                       timeout=180, interval=1.0, what="the controller deciding on fresh demand again")
            lab_edge.origins[0].health_file(lab_edge.workdir).write_text("down")
            seen = wait_until(lambda: (s := ctl.status()).get("checks_down") == ["near"] and s, timeout=120,
                              interval=0.5, what="the controller seeing near DOWN after the restart")
            assert seen["version"] > version_at_stop
            applied(hap, ctl, loop.lb)
            wait_until(lambda: hap.get_weight(BACKEND, "near")[0] == 0, timeout=60,
                       what="the actuator applying the post-restart decision")
            for name, proc in procs.items():
                assert proc is not None and proc.running(), f"{name} exited:\n{proc.tail(30) if proc else ''}"
        finally:
            stack.start_component("kafka") if not stack.component("kafka").running() else None
            stop_all(*reversed(parts))


def test_client_log_limiter_counts_every_warning_and_logs_one_a_minute_per_kind() -> None:
    """The limiter alone (no broker): the unit behind the line bound above, on a fake clock."""
    now = [1000.0]
    name = unique("aiokafka.h9")   # under aiokafka: a logger of the client's
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    lines = Kept()
    logger.addHandler(lines)
    logger.addFilter(ClientLogLimiter(60.0, clock=lambda: now[0]))
    before = REGISTRY.get_sample_value(CLIENT_WARNINGS, {"logger": name, "level": "error"}) or 0
    try:
        for _ in range(500):   # a retry loop with the broker away: 100 ms apart, 50 s
            logger.error("Unable connect to node with id %s: %s", 1, "[Errno 111] Connection refused")
            now[0] += 0.1
        logger.warning("Marking the coordinator dead (node %s)", 1)   # another kind: its own first line
        logger.info("connected")                                       # below warning: untouched, uncounted
        now[0] += 11.0
        logger.error("Unable connect to node with id %s: %s", 1, "[Errno 111] Connection refused")
    finally:
        logger.removeHandler(lines)
    said = [(r.levelname, r.getMessage(), getattr(r, "fields", None)) for r in lines.records]
    assert said == [("ERROR", "Unable connect to node with id 1: [Errno 111] Connection refused", None),
                    ("WARNING", "Marking the coordinator dead (node 1)", None),
                    ("INFO", "connected", None),
                    ("ERROR", "Unable connect to node with id 1: [Errno 111] Connection refused",
                     {"unlogged_since": 499})]
    assert REGISTRY.get_sample_value(CLIENT_WARNINGS, {"logger": name, "level": "error"}) == before + 501
