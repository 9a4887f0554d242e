"""`EdgeApiTokenUnusable` keys on the edge service telling an API that serves from one that is off.

``opsloop_edge_api_token_usable`` reads 0 with the API off as well (nothing sets it), so on its own it would page
every site that runs the control loop without the API. Before (old code): no metric said whether the API was on.
Now ``opsloop_edge_api_serving`` is 1 once the API serves, 0 (exported by default) with it off; the rule
(alerts/rules/edge.yml, promtool test in alerts/tests/edge_test.yml) fires only on token 0 and serving 1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests

from opsloop.stack.process import ManagedProcess
from tests.helpers import free_port, opsloop_process, scrape_metric, unique, wait_until, write_config

pytestmark = pytest.mark.integration

TOPOLOGY = {"listeners": [{"name": "web", "edges": [{"name": "e1"}],
                           "origins": [{"name": "near", "capacity_rps": 40}, {"name": "far", "capacity_rps": 40}],
                           "latency_ms": {"e1": {"near": 2, "far": 30}}}]}


def edge_service(kafka_bootstrap: str, tmp_path: Path, api: dict, ready_url: str | None = None
                 ) -> tuple[ManagedProcess, int]:
    """`opsloop edge run` with the given API section; ready once ``ready_url`` (default: /metrics) answers."""
    metrics_port = free_port()
    config = write_config(tmp_path / "opsloop.yaml", {
        "kafka": {"bootstrap_servers": kafka_bootstrap, "topic_prefix": unique("apiserving") + "."},
        "controllers": {"edge": {"interval_s": 1, "topology": TOPOLOGY, "overrides_file": None,
                                 "metrics_port": metrics_port, "api": api}}})

    def ready() -> bool:
        return requests.get(ready_url or f"http://127.0.0.1:{metrics_port}/metrics", timeout=1).ok

    svc = opsloop_process("edge-api-serving", ["edge", "run", "--config", str(config)], tmp_path / "svc",
                          ready=ready)
    return svc, metrics_port


def test_the_api_serving_with_an_empty_token_file_is_what_the_rule_sees(kafka_bootstrap: str,
                                                                          tmp_path: Path) -> None:
    token_file = tmp_path / "edge.token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)   # empty: the API serves and refuses every /v1 request (503)
    api_port = free_port()
    svc, metrics_port = edge_service(kafka_bootstrap, tmp_path, {"port": api_port, "token_file": str(token_file)},
                                     f"http://127.0.0.1:{api_port}/openapi.json")
    svc.start()
    try:
        assert requests.get(f"http://127.0.0.1:{api_port}/v1/status", timeout=10).status_code == 503
        assert scrape_metric(metrics_port, "opsloop_edge_api_token_usable") == 0
        # set right after the API starts serving (old code: no such metric)
        wait_until(lambda: scrape_metric(metrics_port, "opsloop_edge_api_serving") == 1, timeout=30,
                   what="opsloop_edge_api_serving 1")
        # fixed while nobody calls the API: the loop looks at the file each tick, the gauge (and the alert) follow
        # without a request (before: only a /v1 request re-read it, the alert stayed until someone called)
        token_file.write_text("t" * 32 + "\n")
        wait_until(lambda: scrape_metric(metrics_port, "opsloop_edge_api_token_usable") == 1, timeout=30,
                   what="the token gauge 1 with no API request")
        token_file.write_text("")
        wait_until(lambda: scrape_metric(metrics_port, "opsloop_edge_api_token_usable") == 0, timeout=30,
                   what="the token gauge 0 again with no API request")
    finally:
        svc.stop()


def test_with_the_api_off_the_token_gauge_reads_0_and_serving_says_off(kafka_bootstrap: str,
                                                                       tmp_path: Path) -> None:
    svc, metrics_port = edge_service(kafka_bootstrap, tmp_path, {"enabled": False})
    svc.start()
    try:   # once the loop ticks, an API that is on would be serving
        wait_until(lambda: scrape_metric(metrics_port, "opsloop_edge_last_tick_timestamp_seconds"), timeout=60,
                   what="the control loop ticking")
        assert scrape_metric(metrics_port, "opsloop_edge_api_token_usable") == 0   # what would page without serving
        assert scrape_metric(metrics_port, "opsloop_edge_api_serving") == 0
    finally:
        svc.stop()
