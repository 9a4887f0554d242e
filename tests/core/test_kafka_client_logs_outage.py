"""A broker away, said in a few lines by every service, not one per retry of its Kafka client.

kafka-python (collectors' publisher, edge control, the actuators, the paging actuator, the dead-letter CLI) logs
each failed attempt of each retry loop: with the broker stopped a collector's producer and the paging actuator's
consumer wrote their ``kafka.conn`` / ``kafka.client`` / ``kafka.coordinator`` lines several times a second for the
whole outage. The common logging setup (:func:`opsloop.log.setup_logging`) now counts each warning and error of
the Kafka clients in ``opsloop_kafka_client_log_lines_total{logger,level}`` and lets one line a minute per kind
through. Real processes (``opsloop collect lvs`` publishing, the paging actuator consuming) against the session's
broker stopped for ~20 s. Old code: the line bound fails (and the counter is missing).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from opsloop.stack import ManagedProcess, free_port
from tests.alerting import start_actuator
from tests.helpers import REPO, metric_samples, metric_value, metrics_up, opsloop_process, unique, wait_until, \
    write_config

pytestmark = pytest.mark.integration

OUTAGE_S = 20
CLIENT_LINES = "opsloop_kafka_client_log_lines_total"
# kafka-python lines one service may write in one outage: each kind (logger, level, message template) once a
# minute; some ten kinds come up in 20 s (the old code: one per retry, ~90 lines)
MAX_CLIENT_LINES = 20
LVS = REPO / "collectors" / "lvs" / "testdata"


def kafka_lines(proc: ManagedProcess) -> list[tuple[str, str, str]]:
    """(logger, level, event) of each line kafka-python wrote to a process's log so far."""
    out = []
    for line in proc.logfile.read_bytes().splitlines():
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict) and str(doc.get("logger", "")).split(".")[0] == "kafka":
            out.append((doc["logger"], str(doc.get("level")), str(doc.get("event", ""))[:60]))
    return out


def counted(port: int) -> float:
    return metric_value(metric_samples(port), CLIENT_LINES) or 0.0


def start_lvs_collector(tmp: Path, bootstrap: str) -> tuple[ManagedProcess, int]:
    """`opsloop collect lvs` on recorded /proc files, every 0.5 s, to the session's broker."""
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    config = write_config(tmp / "opsloop.yaml", {
        "kafka": {"bootstrap_servers": bootstrap},
        "collector": {"interval_s": 0.5, "spool_dir": str(tmp / "spool"), "metrics_port": port, "send_timeout_s": 2.0},
        "collectors": {"lvs": {"host": unique("lvs"), "proc_ip_vs": str(LVS / "proc_net_ip_vs.txt"),
                               "proc_ip_vs_stats": str(LVS / "proc_net_ip_vs_stats.txt"),
                               "ipvsadm_stats_command": None, "ipvsadm_rate_command": None}},
    })
    proc = opsloop_process("collector-lvs", ["collect", "lvs", "--config", str(config)], tmp / "collector",
                           ready=lambda: metrics_up(port))
    proc.start()
    return proc, port


def test_a_broker_outage_is_a_few_kafka_client_lines_and_a_counted_rate(stack: Any, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    parts: list[ManagedProcess] = []
    try:
        collector, collector_port = start_lvs_collector(tmp_path / "lvs", bootstrap)
        parts.append(collector)
        # nothing is paged here: the actuator is the consumer side (group coordinator, fetcher)
        paging, paging_port = start_actuator(tmp_path / "paging", bootstrap, "http://127.0.0.1:9")
        parts.append(paging)
        wait_until(lambda: (metric_value(metric_samples(collector_port), "opsloop_collector_published_records_total")
                            or 0) >= 2, timeout=60, what="the collector publishing")
        services = {"collector": (collector, collector_port), "paging": (paging, paging_port)}
        at_stop = {name: (len(kafka_lines(p)), counted(port)) for name, (p, port) in services.items()}
        stack.component("kafka").stop()
        deadline = time.monotonic() + OUTAGE_S
        while time.monotonic() < deadline:   # the outage lasts OUTAGE_S whatever the services do
            for name, (proc, _) in services.items():
                assert proc.running(), f"{name} exited during the outage:\n{proc.tail(30)}"
            time.sleep(1)
        for name, (proc, port) in services.items():
            lines_before, counted_before = at_stop[name]
            during = kafka_lines(proc)[lines_before:]
            assert during, f"{name} said nothing of the outage"   # the first line of each kind goes out at once
            assert len(during) <= MAX_CLIENT_LINES, \
                f"{name}: {len(during)} kafka-python lines in {OUTAGE_S} s: {Counter(during).most_common(5)}"
            # each retry's line is counted, written or not: the outage is a rate in /metrics
            assert counted(port) > counted_before + len(during), f"{name}: the client's lines were not counted"
        stack.start_component("kafka")
    finally:
        if not stack.component("kafka").running():
            stack.start_component("kafka")
        for proc in reversed(parts):
            proc.stop()
