"""Samples/s per stream worker with every handler on, next to a raw consume + decode loop (same run).

A fleet's telemetry (``bench/stream_workload.py``: LB rows, IPMI power and sensors, firewall reports,
Keystone and netperf results; ~29 samples per record: 50 per LB, 25 per server, 31 per hypervisor;
Telegraf batch shape) fills the five telemetry topics; then, taking turns on the same records from
the same real broker:

* the **worker** (``opsloop stream worker``: Faust, the ``lb`` agent with rates and edge demand, the
  ``detectors`` agent with the firewall, Keystone, netperf, power and anomaly detectors and their
  changelogged state table), timed from its first counted sample to its last
  (``opsloop_stream_samples_total``, the count it exports, summed over the topics);
* the **raw loop**: aiokafka ``getmany`` + ``orjson.loads`` of every record, nothing else — the floor
  of any consumer in Python;
* the **plain loop**: the worker's handlers without Faust (:class:`bench.stream_workload.Pipeline`,
  sending the demand records and the touched state keys as the worker does).

The machine has 2 shared cores: absolute figures move with the other work on it; the ratios to the
raw loop, measured in the same run, are what to compare.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import requests
import yaml

from bench.stream_workload import Fleet, Pipeline, Record, bench_settings, fleet_round
from opsloop.config import Settings, StackSettings, StreamSettings
from opsloop.stack import ManagedProcess, Stack, free_port
from opsloop.kafka_admin import ensure_topics
from opsloop.topics import TELEMETRY_TOPICS, Topic
from opsloop.streams.runtime.gc_tuning import tune_gc

TOPICS = [t.value for t in TELEMETRY_TOPICS]
TARGET = 100_000   # samples/s per worker, every handler on
PARTITIONS = 4
# where the plain loop sends what the worker sends to edge.demand and its state changelog (not read back)
PLAIN_OUT = {Topic.EDGE_DEMAND.value: "bench.plain.demand", "detector-state": "bench.plain.state"}


def produce(bootstrap: str, records: list[Record]) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=1 << 20,
                      max_request_size=8 << 20, compression_type=None)
    for topic, key, value in records:
        p.send(topic, key=key, value=value)
    p.flush()
    p.close()


def fleet_records(fleet: Fleet, rounds: int, t0: float) -> list[Record]:
    return [r for n in range(rounds) for r in fleet_round(fleet, n, t0)]


def _consumer(bootstrap: str) -> Any:
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(*TOPICS, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                            enable_auto_commit=False, group_id=None, max_partition_fetch_bytes=8 << 20,
                            fetch_max_bytes=64 << 20, fetch_max_wait_ms=StreamSettings().fetch_max_wait_ms)


async def raw_loop(bootstrap: str, n_samples: int) -> float:
    """Consume + orjson-decode every record, count its samples: samples/s from the first fetch."""
    c = _consumer(bootstrap)
    await c.start()
    seen, t_first = 0, None
    try:
        while seen < n_samples:
            got = await c.getmany(timeout_ms=1000, max_records=2000)
            for msgs in got.values():
                if t_first is None:
                    t_first = time.perf_counter()
                for m in msgs:
                    seen += len(orjson.loads(m.value)["metrics"])
    finally:
        await c.stop()
    return seen / (time.perf_counter() - (t_first or time.perf_counter()))


async def plain_loop(bootstrap: str, n_samples: int) -> float:
    """The worker's handlers in one plain aiokafka loop (no Faust), sending what the worker sends."""
    from aiokafka import AIOKafkaProducer

    c = _consumer(bootstrap)
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await c.start()
    await p.start()
    pipe = Pipeline(Settings.model_validate(bench_settings()))
    tune_gc()   # the worker's GC settings
    seen, t_first = 0, None
    try:
        while seen < n_samples:
            got = await c.getmany(timeout_ms=1000, max_records=2000)
            msgs = [m for part in got.values() for m in part]
            if not msgs:
                continue
            if t_first is None:
                t_first = time.perf_counter()
            seen += pipe.handle(msgs)
            for topic, key, value in pipe.drain():
                await p.send(PLAIN_OUT.get(topic, topic), key=key, value=value)
    finally:
        await c.stop()
        await p.stop()
    return seen / (time.perf_counter() - (t_first or time.perf_counter()))


def samples_total(port: int, family: str = "opsloop_stream_samples_total") -> float:
    # name[] restricts the exposition to one family: polling must not load the worker it measures
    text = requests.get(f"http://127.0.0.1:{port}/metrics", params={"name[]": family}, timeout=2).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(family + "{"))


def metric_lines(port: int, family: str) -> dict[str, float]:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", params={"name[]": family}, timeout=2).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(family)}


def rss_kib(pid: int, field: str = "VmHWM:") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


class Worker:
    """One ``opsloop stream worker`` process with the benches' settings (every detector on)."""

    def __init__(self, tmp: Path, bootstrap: str, app_id: str | None = None, name: str | None = None,
                 partitions: int = PARTITIONS, **stream: Any) -> None:
        self.name = name or uuid.uuid4().hex[:8]
        self.port = free_port()
        self.app_id = app_id or f"bench-{self.name}"
        cfg = tmp / f"opsloop-{self.name}.yaml"
        doc = bench_settings(app_id=self.app_id, data_dir=str(tmp / f"streams-{self.name}"), metrics_port=self.port,
                             web_port=free_port(), **stream)
        doc["kafka"] = {"bootstrap_servers": bootstrap, "partitions": partitions}
        cfg.write_text(yaml.safe_dump(doc))
        self.proc = ManagedProcess(
            name=f"bench-worker-{self.name}", workdir=tmp / f"worker-{self.name}", ready_timeout_s=120,
            argv=[sys.executable, "-m", "opsloop.cli", "stream", "worker", "--config", str(cfg)],
            ready=lambda: requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=1).ok)

    def start(self) -> "Worker":
        self.proc.start()
        return self

    def stop(self) -> None:
        self.proc.stop()

    @property
    def pid(self) -> int:
        got = self.proc.read_pid()
        return got[0] if got else 0

    def samples(self) -> float:
        return samples_total(self.port)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_worker(w: Worker, n_samples: int, timeout_s: float = 900) -> tuple[float, float]:
    """Samples/s from the worker's first counted sample to the n-th; returns (rate, seconds)."""
    rate, elapsed, _ = time_worker_cpu(w, n_samples, timeout_s)
    return rate, elapsed


def time_worker_cpu(w: Worker, n_samples: int, timeout_s: float = 900) -> tuple[float, float, float]:
    """:func:`time_worker` and the worker's CPU time per sample over the same interval (seconds):
    what it costs, apart from how much of the shared cores it got."""
    t_first = v_first = None
    cpu_first = 0.0
    v = 0.0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = w.samples()
        if t_first is None and v > 0:
            t_first, v_first, cpu_first = time.perf_counter(), v, cpu_seconds(w.pid)
        if v >= n_samples:
            break
        time.sleep(0.25)   # each poll costs the worker a request on its metrics thread
    if t_first is None or v_first is None:
        return 0.0, 0.0, 0.0
    elapsed = time.perf_counter() - t_first
    cpu = cpu_seconds(w.pid) - cpu_first
    counted = v - v_first
    return ((counted / elapsed) if elapsed > 0 else 0.0), elapsed, (cpu / counted if counted > 0 else 0.0)


def kafka_stack(tmp: Path) -> Stack:
    return Stack(StackSettings(data_dir=tmp / "stack", kafka_port=free_port(), kafka_controller_port=free_port(),
                               prometheus_port=free_port(), alertmanager_port=free_port(), scrape_targets=[]),
                 with_alertmanager=False, with_prometheus=False)


def run(quick: bool = False) -> list[dict[str, Any]]:
    fleet = Fleet()
    n_rounds = 8 if quick else 60   # 60 rounds: ~15 s per worker run, the 0.25 s polls a few per mille of it
    repeats = 1 if quick else 3
    with tempfile.TemporaryDirectory(prefix="opsloop-bench-") as d:
        tmp = Path(d)
        stack = kafka_stack(tmp)
        stack.up()
        try:
            ensure_topics(stack.kafka_bootstrap, PARTITIONS, 1)
            ensure_topics(stack.kafka_bootstrap, PARTITIONS, 1, topics=list(PLAIN_OUT.values()))
            records = fleet_records(fleet, n_rounds, time.time() - 3600 - n_rounds * 15)
            n_samples = sum(len(orjson.loads(v)["metrics"]) for _, _, v in records)
            produce(stack.kafka_bootstrap, records)
            del records
            raws, plains, workers, cpus, rss = [], [], [], [], 0
            load = [os.getloadavg()[0]]
            for _ in range(repeats):   # the machine is shared: take turns, compare medians
                raws.append(asyncio.run(raw_loop(stack.kafka_bootstrap, n_samples)))
                plains.append(asyncio.run(plain_loop(stack.kafka_bootstrap, n_samples)))
                w = Worker(tmp, stack.kafka_bootstrap).start()
                try:
                    rate, _, cpu = time_worker_cpu(w, n_samples)
                    workers.append(rate)
                    cpus.append(cpu)
                    rss = max(rss, rss_kib(w.pid))
                    load.append(os.getloadavg()[0])
                finally:
                    w.stop()
        finally:
            stack.down()
    raw, plain, worker = statistics.median(raws), statistics.median(plains), statistics.median(workers)
    cpu_us = statistics.median(cpus) * 1e6
    note = (f"{n_samples:,} samples, {fleet.series:,} series, median of {repeats}; 2 shared cores, "
            f"load average {min(load):.1f}-{max(load):.1f}")
    return [
        {"benchmark": "stream worker, every handler on", "metric": "samples/s per worker", "value": round(worker),
         "baseline": f"raw consume + orjson decode, same records ({note})", "baseline_value": round(raw),
         "ratio": round(worker / raw, 3) if raw else 0.0, "unit": "samples/s", "target": f"≥ {TARGET:,}/s",
         "ok": worker >= TARGET},
        {"benchmark": "stream handlers without Faust", "metric": "samples/s, plain aiokafka loop", "value": round(plain),
         "baseline": "raw consume + orjson decode (same run)", "baseline_value": round(raw),
         "ratio": round(plain / raw, 3) if raw else 0.0, "unit": "samples/s", "target": "report", "ok": None},
        {"benchmark": "stream worker vs plain loop", "metric": "Faust's share", "value": round(worker),
         "baseline": "plain loop, same handlers (same run)", "baseline_value": round(plain),
         "ratio": round(worker / plain, 3) if plain else 0.0, "unit": "samples/s", "target": "report", "ok": None},
        {"benchmark": "stream worker CPU per sample, every handler on", "metric": "CPU µs per sample (all threads)",
         "value": round(cpu_us, 2), "baseline": "the rate one core would give", "baseline_value": round(1e6 / cpu_us)
         if cpu_us else 0, "ratio": 0.0, "unit": "µs", "target": "report", "ok": None},
        {"benchmark": "stream worker memory, every handler on", "metric": "peak RSS", "value": round(rss / 1024, 1),
         "baseline": "-", "baseline_value": 0.0, "ratio": 0.0, "unit": "MiB", "target": "report", "ok": None},
    ]


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  python -m bench.bench_stream_fleet --quick\n"
                                        "  python -m bench --only stream_fleet")
    ap.add_argument("--quick", action="store_true", help="8 rounds of the fleet (60 otherwise), one turn each")
    for row in run(quick=ap.parse_args().quick):
        print(row)
