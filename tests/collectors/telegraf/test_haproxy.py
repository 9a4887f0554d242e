"""Telegraf feeding the edge-weight loop, end to end through real components:

known HTTP traffic → real HAProxy (lab edge) → real Telegraf (inputs.haproxy on the admin socket,
sample config, outputs.kafka) → real Kafka → our Faust stream worker (lb-rates) → /metrics → real
Prometheus; our own haproxy collector reads the same HAProxy under another LB name, and both must
yield the same opsloop_lb_server_requests_per_second{lb,backend,server} series with the same rates.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from opsloop.lab.traffic import TrafficGenerator
from opsloop.topics import Topic
from tests.collectors.telegraf.lab import ensure_telegraf, sample_config, telegraf_process
from tests.e2e.pipeline import pipeline_config, start_collector, start_worker
from tests.helpers import prom_query, read_topic, unique, wait_until

pytestmark = pytest.mark.integration

RATE = 30.0  # requests/s through the edge, split round-robin between two equal-weight servers
# Same tolerance as tests/e2e/test_lb_pipeline.py: open-loop paced generator, 10 s averages.
TOLERANCE = 0.15
WINDOW = "10s"


def _rates(prom: str, metric: str, lb: str) -> dict[tuple[str, ...], float]:
    rows = prom_query(prom, f'avg_over_time({metric}{{lb="{lb}"}}[{WINDOW}])')
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k not in ("lb", "instance", "job", "component"))):
            float(r["value"][1]) for r in rows}


def _settled(prom: str, lb: str) -> bool:
    # 12 s of samples in range: the 10 s average covers steady traffic only.
    n = prom_query(prom, f'count_over_time(opsloop_lb_server_requests_per_second{{lb="{lb}"}}[12s])')
    return len(n) == 2 and all(float(r["value"][1]) >= 8 for r in n)


def test_telegraf_haproxy_records_become_the_same_request_rates(stack, lab_edge, tmp_path: Path) -> None:
    ensure_telegraf()
    lab_edge.start()
    tg_lb, own_lb = unique("edge-tg"), unique("edge-own")
    config, doc = pipeline_config(tmp_path, stack, {"haproxy": {"instances": {own_lb: str(lab_edge.admin_socket)}}})
    worker = start_worker(tmp_path, config, doc, stack)
    collector = start_collector("haproxy", tmp_path, config, doc, stack)
    telegraf = telegraf_process("telegraf-haproxy", sample_config("haproxy"), {
        "OPSLOOP_KAFKA_BROKERS": stack.kafka_bootstrap, "OPSLOOP_HAPROXY_SOCKET": str(lab_edge.admin_socket),
        "OPSLOOP_HOST_NAME": tg_lb, "OPSLOOP_TELEGRAF_INTERVAL": "1s", "OPSLOOP_TELEGRAF_FLUSH_INTERVAL": "1s",
    }, tmp_path / "telegraf")
    telegraf.start()
    gen = TrafficGenerator(lab_edge.url, RATE, workers=6).start()
    try:
        prom = stack.prometheus_url
        wait_until(lambda: _settled(prom, tg_lb) and _settled(prom, own_lb), timeout=120, interval=1,
                   what=f"two servers' rates from Telegraf ({telegraf.logfile}) and our collector")
        tg = _rates(prom, "opsloop_lb_server_requests_per_second", tg_lb)
        own = _rates(prom, "opsloop_lb_server_requests_per_second", own_lb)
        # Same series: {backend, server} label sets identical, only `lb` differs.
        assert set(tg) == set(own) == {(("backend", "be_web"), ("server", s)) for s in ("near", "far")}
        for series, rate in tg.items():
            assert rate == pytest.approx(RATE / 2, rel=TOLERANCE), (series, tg)
            assert rate == pytest.approx(own[series], rel=TOLERANCE), (series, tg, own)
        tg_backend = _rates(prom, "opsloop_lb_backend_requests_per_second", tg_lb)
        assert list(tg_backend) == [(("backend", "be_web"),)]
        assert next(iter(tg_backend.values())) == pytest.approx(RATE, rel=TOLERANCE)
        # Weight and state come through Telegraf's string/number fields as well.
        weights = prom_query(prom, f'opsloop_lb_server_weight{{lb="{tg_lb}"}}')
        assert sorted(float(r["value"][1]) for r in weights) == [100.0, 100.0]
        ups = prom_query(prom, f'opsloop_lb_server_up{{lb="{tg_lb}"}}')
        assert [float(r["value"][1]) for r in ups] == [1.0, 1.0]
        assert gen.codes.get(200, 0) == sum(gen.codes.values()) > 0
        # Nothing from Telegraf or our collector was dead-lettered, and no handler failed in this worker.
        # The worker also reads what earlier tests left on the shared topic (garbage included, which it
        # rightly dead-letters), so the dead letters are matched by this test's keys, not counted.
        ours = {tg_lb, own_lb}
        dead = [d for d in (orjson.loads(r.value) for r in read_topic(stack.kafka_bootstrap, Topic.DEADLETTER.value))
                if d.get("key") in ours]
        assert dead == []
        worker_instance = f'instance="127.0.0.1:{doc["stream"]["metrics_port"]}"'
        errors = prom_query(prom, f"sum(opsloop_stream_errors_total{{{worker_instance}}}) or vector(0)")
        assert float(errors[0]["value"][1]) == 0.0
    finally:
        gen.stop()
        telegraf.stop()
        collector.stop()
        worker.stop()
