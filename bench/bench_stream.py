"""Stream stage throughput: samples/s through Kafka → Faust worker → Prometheus gauges, per worker,
next to a plain aiokafka consumer loop doing the same decoding and the same handlers in the same run.

Data: LB samples (``haproxy`` rows) published as collector rounds do: one Kafka record per load balancer
and round carrying ``ROWS`` samples (Telegraf batch shape). Both consumers read the same records from
the same real broker. The worker's peak RSS under this load is reported too.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import requests
from kafka import KafkaProducer

from opsloop.config import StackSettings, StreamSettings
from opsloop.stack import ManagedProcess, Stack, free_port
from opsloop.kafka_admin import ensure_topics
from opsloop.topics import Topic
from opsloop.streams.edge.demand import DemandAggregator
from opsloop.streams.lb.rates import LbRates
from opsloop.streams.runtime.batch import decode_messages
from opsloop.streams.runtime.gc_tuning import tune_gc

ROWS = 50  # samples per record (one LB's show stat per round)


def _records(n_records: int, t0: float) -> list[tuple[bytes, bytes]]:
    out = []
    n_lbs = 40
    for i in range(n_records):
        lb = f"lb{i % n_lbs}"
        rnd = i // n_lbs
        ts = t0 + rnd
        metrics = [{"name": "haproxy", "tags": {"host": lb, "proxy": "be", "sv": f"s{j}", "type": "server"},
                    "fields": {"hrsp_2xx": rnd * 10 + j, "stot": rnd * 10, "status": "UP", "weight": 100},
                    "timestamp": ts} for j in range(ROWS)]
        out.append((lb.encode(), orjson.dumps({"schema_version": 1, "metrics": metrics})))
    return out


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    p = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=1 << 20,
                      max_request_size=8 << 20)
    for k, v in records:
        p.send(topic, key=k, value=v)
    p.flush()
    p.close()


async def _plain_loop(bootstrap: str, topic: str, n_samples: int) -> float:
    """The baseline: the worker's work on ``telemetry.lb`` (decode once, lb-rates, edge demand, send the
    demand records) in one plain aiokafka consume loop, without Faust."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                         group_id=None, max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20,
                         fetch_max_wait_ms=StreamSettings().fetch_max_wait_ms)  # the worker's setting
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1)
    await c.start()
    await p.start()
    rates = LbRates()
    demand = DemandAggregator(rates=rates)
    tune_gc()  # the worker's GC settings, so the ratio measures Faust's path and nothing else
    seen = 0
    t_first = None
    try:
        while seen < n_samples:
            batches = await c.getmany(timeout_ms=1000, max_records=2000)
            for msgs in batches.values():
                if t_first is None:
                    t_first = time.perf_counter()
                batch = decode_messages(msgs)  # type: ignore[arg-type]
                now = time.time()
                rates.handle(batch.metrics, now)
                demand.handle(batch.metrics, now)
                for rec in demand.drain():
                    await p.send(Topic.EDGE_DEMAND.value, key=rec.key.encode(), value=rec.encode())
                seen += len(batch.metrics)
    finally:
        await c.stop()
        await p.stop()
    return seen / (time.perf_counter() - (t_first or time.perf_counter()))


def _samples_total(port: int) -> float:
    # name[] restricts the exposition to one family: polling must not load the worker it measures
    text = requests.get(f"http://127.0.0.1:{port}/metrics", params={"name[]": "opsloop_stream_samples_total"},
                        timeout=2).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith('opsloop_stream_samples_total{topic="telemetry.lb"}'):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _faust_worker(tmp: Path, bootstrap: str, n_samples: int) -> tuple[float, int]:
    """One worker (its own consumer group) reading the whole of ``telemetry.lb`` from the start."""
    import sys
    import uuid

    import yaml

    run_id = uuid.uuid4().hex[:8]
    port = free_port()
    cfg = tmp / f"opsloop-{run_id}.yaml"
    # The worker's default batching (stream.batch_size, batch_within_s): the figure is what a deployment gets.
    cfg.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": bootstrap},
        "stream": {"app_id": f"bench-{run_id}", "data_dir": str(tmp / f"streams-{run_id}"), "metrics_port": port,
                   "web_port": free_port()},
    }))
    w = ManagedProcess(name="bench-worker", workdir=tmp / f"worker-{run_id}", ready_timeout_s=90,
                       argv=[sys.executable, "-m", "opsloop.cli", "stream", "worker", "--config", str(cfg)],
                       ready=lambda: requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1).ok)
    # Same conditions as the plain loop: the topic is full before the worker starts, and the clock runs
    # from the worker's first processed sample to its last (start-up and group join excluded).
    w.start()
    try:
        t_first = None
        v = 0.0
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            v = _samples_total(port)
            if t_first is None and v > 0:
                t_first, v_first = time.perf_counter(), v
            if v >= n_samples:
                break
            time.sleep(0.02)
        elapsed = time.perf_counter() - (t_first or time.perf_counter())
        rate = (v - v_first) / elapsed if t_first is not None and elapsed > 0 else 0.0
        rss = _rss_peak_kib(w.read_pid()[0])  # type: ignore[index]
        return rate, rss
    finally:
        w.stop()


def run(quick: bool = False) -> list[dict[str, Any]]:
    n_records = 2000 if quick else 8000
    n_samples = n_records * ROWS
    rounds = 2 if quick else 3
    with tempfile.TemporaryDirectory(prefix="opsloop-bench-") as d:
        tmp = Path(d)
        stack = Stack(StackSettings(data_dir=tmp / "stack", kafka_port=free_port(), kafka_controller_port=free_port(),
                                    prometheus_port=free_port(), alertmanager_port=free_port(), scrape_targets=[]),
                      with_alertmanager=False, with_prometheus=False)
        stack.up()
        try:
            ensure_topics(stack.kafka_bootstrap, 4, 1)   # what the worker creates; the plain loop sends to edge.demand too
            records = _records(n_records, time.time() - 3600)
            bench_topic = "bench.lb"
            _produce(stack.kafka_bootstrap, bench_topic, records)
            _produce(stack.kafka_bootstrap, Topic.LB.value, records)
            # The machine is shared and noisy: plain loop and worker take turns, medians are compared.
            plains, workers, rss = [], [], 0
            for _ in range(rounds):
                plains.append(asyncio.run(_plain_loop(stack.kafka_bootstrap, bench_topic, n_samples)))
                rate, peak = _faust_worker(tmp, stack.kafka_bootstrap, n_samples)
                workers.append(rate)
                rss = max(rss, peak)
        finally:
            stack.down()
    plain, faust_rate = statistics.median(plains), statistics.median(workers)
    ratio = faust_rate / plain if plain else 0.0
    return [
        {"benchmark": "stream stage (Kafka→Faust→metrics)", "metric": "samples/s per worker", "value": round(faust_rate),
         "baseline": f"plain aiokafka loop, same decode+handlers (median of {rounds})", "baseline_value": round(plain), "ratio": round(ratio, 3),
         "unit": "samples/s", "target": "ratio ≥ 0.5", "ok": ratio >= 0.5},
        {"benchmark": "stream worker memory", "metric": "peak RSS under load", "value": round(rss / 1024, 1),
         "baseline": "-", "baseline_value": 0.0, "ratio": 0.0, "unit": "MiB", "target": "report", "ok": None},
    ]


if __name__ == "__main__":
    from bench.single import main

    raise SystemExit(main("bench.bench_stream", __doc__, run))
