"""A collector whose every round fails from its first start (its tool missing, no privilege) still exports its
samples and rounds counters, at 0: `OpsloopCollectorBlind` compares the error rate with the sample rate and finds
nothing to compare against when the samples series was never created (before, only a successful round created
it, so a collector blind since its start was never called blind; alerts/tests/pipeline_test.yml feeds the rule
the 0 series this makes real)."""

from __future__ import annotations

import threading
from pathlib import Path

from prometheus_client import REGISTRY

from opsloop.collect.runner import run_loop
from opsloop.collect.types import CollectorUnavailable, Round
from tests.helpers import (free_port, metric_samples, metric_value, metrics_up, opsloop_process, unique, wait_until,
                           write_config)


class _NoTool:
    def __init__(self, name: str) -> None:
        self.name = name

    def collect(self) -> Round:
        raise CollectorUnavailable("ipmitool not found ('/nowhere/ipmitool')")


def test_a_collector_failing_every_round_exports_zero_samples_from_the_start() -> None:
    name = unique("blind")
    assert run_loop(_NoTool(name), interval_s=0.01, max_rounds=2, stop=threading.Event()) == 2
    assert REGISTRY.get_sample_value("opsloop_collector_samples_total", {"collector": name}) == 0.0
    assert REGISTRY.get_sample_value("opsloop_collector_rounds_total", {"collector": name}) == 0.0
    assert REGISTRY.get_sample_value("opsloop_collector_errors_total", {"collector": name, "kind": "tool"}) == 2.0


def test_the_lvs_collector_without_ipvs_exports_zero_samples_and_its_errors(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The real service: `opsloop collect lvs` on a host without IPVS (every source missing) keeps running, counts
    each failed round and exports its samples counter at 0 beside the errors."""
    port = free_port()
    gone = tmp_path / "no-ipvs"
    config = write_config(tmp_path / "opsloop.yaml", {
        "kafka": {"bootstrap_servers": kafka_bootstrap, "topic_prefix": unique("blind")},
        "collector": {"interval_s": 0.2, "spool_dir": str(tmp_path / "spool"), "metrics_port": port},
        "collectors": {"lvs": {"proc_ip_vs": str(gone / "ip_vs"), "proc_ip_vs_stats": str(gone / "ip_vs_stats"),
                               "ipvsadm_stats_command": None, "ipvsadm_rate_command": None}}})
    proc = opsloop_process("collect-lvs", ["collect", "lvs", "--config", str(config)], tmp_path,
                           ready=lambda: metrics_up(port))
    proc.start()
    try:
        def failed_rounds() -> float:
            return metric_value(metric_samples(port), "opsloop_collector_errors_total",
                                {"collector": "lvs", "kind": "tool"}) or 0.0
        wait_until(lambda: failed_rounds() >= 2, timeout=60, what="two failed rounds counted")
        samples = metric_samples(port)
        assert metric_value(samples, "opsloop_collector_samples_total", {"collector": "lvs"}) == 0.0
        assert metric_value(samples, "opsloop_collector_rounds_total", {"collector": "lvs"}) == 0.0
        assert proc.running()
    finally:
        proc.stop()
