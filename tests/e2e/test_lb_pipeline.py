"""One signal end to end through real components:

known HTTP traffic → real HAProxy → haproxy collector (runtime API) → real Kafka → Faust stream
worker (per-server request rates) → /metrics → scraped by a real Prometheus → asserted through
Prometheus's HTTP API.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.lab.traffic import TrafficGenerator
from tests.e2e.pipeline import pipeline_config, start_collector, start_worker
from tests.helpers import prom_query, unique, wait_until

pytestmark = pytest.mark.integration

RATE = 30.0  # requests/s sent through the edge
# Tolerance for the measured rate: the generator is open-loop and paced, HAProxy splits round-robin
# between two equal-weight servers; the rate is averaged over 10 s of 1 s collection rounds.
TOLERANCE = 0.15


def test_haproxy_request_rates_reach_prometheus(stack, lab_edge, tmp_path: Path) -> None:
    lab_edge.start()
    lb = unique("edge")
    config, doc = pipeline_config(tmp_path, stack, {"haproxy": {"instances": {lb: str(lab_edge.admin_socket)}}})
    worker = start_worker(tmp_path, config, doc, stack)
    collector = start_collector("haproxy", tmp_path, config, doc, stack)
    gen = TrafficGenerator(lab_edge.url, RATE, workers=6).start()
    try:
        q_server = f'avg_over_time(opsloop_lb_server_requests_per_second{{lb="{lb}"}}[10s])'
        q_backend = f'avg_over_time(opsloop_lb_backend_requests_per_second{{lb="{lb}"}}[10s])'

        def settled() -> list[dict] | None:
            # 12 s of samples in the window's range means the average covers steady traffic only.
            n = prom_query(stack.prometheus_url, f'count_over_time(opsloop_lb_server_requests_per_second{{lb="{lb}"}}[12s])')
            if len(n) != 2 or any(float(r["value"][1]) < 8 for r in n):
                return None
            return prom_query(stack.prometheus_url, q_server)

        servers = wait_until(settled, timeout=120, interval=1, what="two servers' rates in Prometheus")
        by_server = {r["metric"]["server"]: float(r["value"][1]) for r in servers}
        assert set(by_server) == {"near", "far"}
        for name, rate in by_server.items():
            assert rate == pytest.approx(RATE / 2, rel=TOLERANCE), (name, by_server)
        backend = prom_query(stack.prometheus_url, q_backend)
        assert len(backend) == 1
        assert float(backend[0]["value"][1]) == pytest.approx(RATE, rel=TOLERANCE)
        assert sum(gen.codes.values()) > 0 and gen.codes.get(200, 0) == sum(gen.codes.values())
        # The worker's own health is scraped too.
        ups = prom_query(stack.prometheus_url, 'opsloop_stream_samples_total{topic="telemetry.lb"}')
        assert ups and max(float(r["value"][1]) for r in ups) > 0
    finally:
        gen.stop()
        collector.stop()
        worker.stop()
