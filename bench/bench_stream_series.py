"""Cost per series of the stream worker: RSS, throughput and changelog state at 10k, 100k and 1M series.

Cardinality is what grows in production. For each size a fleet of that many distinct series (same mix
as ``bench_stream_fleet``: LB server rows, IPMI power and sensors, firewall ports and rulesets,
Keystone, netperf; ``Fleet.with_series``) sends a few rounds through one worker (every handler on,
default caps: ``stream.max_state_keys`` 20,000 per handler, ``state_ttl_s`` 3600 s, anomaly
``max_series`` 50,000) on a fresh broker. Printed per size:

* samples/s through the worker (first to last counted sample), and after the first round (which
  creates every series' state: with few rounds per size, it weighs most at the largest sizes);
* RSS after the rounds (VmRSS) and its growth over the idle worker, per series;
* the ``detector-state`` changelog (read back from Kafka, latest value per key): keys and bytes per
  handler, bytes per key and per series;
* ``opsloop_stream_state_dropped_total`` (caps and TTLs at work) and ``opsloop_stream_state_keys``.

The machine has 2 shared cores: throughput moves with the other work on it; memory and state sizes
do not.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import orjson

from bench.bench_stream_fleet import PARTITIONS, Worker, kafka_stack, metric_lines, rss_kib
from bench.stream_workload import Fleet, fleet_round
from opsloop.kafka_admin import ensure_topics

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000, 100_000)
MIN_SAMPLES = 300_000   # rounds per size: enough samples to time


def produce_rounds(bootstrap: str, fleet: Fleet, rounds: int, t0: float) -> int:
    """Send ``rounds`` rounds of ``fleet`` without holding them in memory; returns the samples sent."""
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=1 << 20,
                      max_request_size=8 << 20)
    n = 0
    for r in range(rounds):
        for topic, key, value in fleet_round(fleet, r, t0):
            n += value.count(b'"timestamp":')   # once per sample (tags hold a "name" too)
            p.send(topic, key=key, value=value)
    p.flush()
    p.close()
    return n


def changelog(bootstrap: str, app_id: str) -> dict[str, tuple[int, int]]:
    """handler -> (keys, bytes) of the ``detector-state`` changelog's latest value per key."""
    from kafka import KafkaConsumer, TopicPartition

    topic = f"{app_id}-detector-state-changelog"
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                      max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20, consumer_timeout_ms=5000)
    try:
        parts = [TopicPartition(topic, p) for p in (c.partitions_for_topic(topic) or ())]
        c.assign(parts)
        c.seek_to_beginning(*parts)
        ends = c.end_offsets(parts)
        latest: dict[bytes, int] = {}
        for msg in _until(c, ends):
            if msg.value is None:
                latest.pop(msg.key, None)
            else:
                latest[msg.key] = len(msg.value)
    finally:
        c.close()
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for key, size in latest.items():
        handler = orjson.loads(key).split("|", 1)[0] if key else "?"
        out[handler][0] += 1
        out[handler][1] += size
    return {h: (v[0], v[1]) for h, v in out.items()}


def _until(c: Any, ends: dict[Any, int]) -> Iterator[Any]:
    left = {tp for tp, end in ends.items() if end > 0}
    while left:
        batch = c.poll(timeout_ms=2000, max_records=5000)
        if not batch:
            break
        for tp, msgs in batch.items():
            yield from msgs
            if msgs and msgs[-1].offset + 1 >= ends[tp]:
                left.discard(tp)


def dropped(port: int) -> dict[str, float]:
    """``handler/reason`` -> drops, plus the anomaly detector's ignored new series."""
    out = {}
    for line, v in metric_lines(port, "opsloop_stream_state_dropped_total").items():
        labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:-1].replace('"', "").split(","))
        out[f"{labels['handler']}/{labels['reason']}"] = v
    for line, v in metric_lines(port, "opsloop_anomaly_series_dropped_total").items():
        out["anomaly/max_series"] = out.get("anomaly/max_series", 0.0) + v
    return out


def timed_rounds(w: Worker, n_samples: float, first_round: float, timeout_s: float = 1800) -> tuple[float, float]:
    """(samples/s over all rounds, samples/s after the first round): the first round creates every
    series' state, later ones update it; both from the worker's first counted sample."""
    t_first = t_warm = None
    v_first = v_warm = 0.0
    v = 0.0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = w.samples()
        now = time.perf_counter()
        if t_first is None and v > 0:
            t_first, v_first = now, v
        if t_warm is None and v >= first_round:
            t_warm, v_warm = now, v
        if v >= n_samples:
            break
        time.sleep(0.25)
    end = time.perf_counter()
    rate = (v - v_first) / (end - t_first) if t_first is not None and end > t_first else 0.0
    warm = (v - v_warm) / (end - t_warm) if t_warm is not None and end > t_warm and v > v_warm else 0.0
    return rate, warm


def one_size(n_series: int, idle_rss_kib: int | None) -> dict[str, Any]:
    fleet = Fleet.with_series(n_series)
    rounds = max(2, math.ceil(MIN_SAMPLES / fleet.series))
    with tempfile.TemporaryDirectory(prefix="opsloop-bench-") as d:
        tmp = Path(d)
        stack = kafka_stack(tmp)
        stack.up()
        try:
            ensure_topics(stack.kafka_bootstrap, PARTITIONS, 1)
            if idle_rss_kib is None:   # the idle worker, once: what every size's growth is measured from
                w0 = Worker(tmp, stack.kafka_bootstrap).start()
                time.sleep(5)
                idle_rss_kib = rss_kib(w0.pid, "VmRSS:")
                w0.stop()
            n_samples = produce_rounds(stack.kafka_bootstrap, fleet, rounds, time.time() - 3600 - rounds * 15)
            w = Worker(tmp, stack.kafka_bootstrap).start()
            try:
                rate, warm = timed_rounds(w, n_samples, first_round=n_samples / rounds)
                time.sleep(2)   # the last batch's state writes
                rss = rss_kib(w.pid, "VmRSS:")
                peak = rss_kib(w.pid, "VmHWM:")
                drops = dropped(w.port)
                keys = {line[line.index('"') + 1:line.rindex('"')]: v
                        for line, v in metric_lines(w.port, "opsloop_stream_state_keys").items()}
            finally:
                w.stop()
            state = changelog(stack.kafka_bootstrap, w.app_id)
        finally:
            stack.down()
    return {"series": fleet.series, "rounds": rounds, "samples": n_samples, "rate": rate, "warm": warm, "rss_kib": rss,
            "peak_kib": peak, "idle_kib": idle_rss_kib, "state": state, "dropped": drops, "keys": keys}


def table(results: list[dict[str, Any]]) -> str:
    head = ("| series | samples/s (after the 1st round) | RSS MiB (idle) | RSS growth per series | marginal RSS per series | changelog keys "
            "| changelog MiB | bytes per key | changelog bytes per series | dropped (handler/reason) |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    prev: dict[str, Any] | None = None
    for r in results:
        marginal = ("-" if prev is None else
                    f"{(r['rss_kib'] - prev['rss_kib']) * 1024 / (r['series'] - prev['series']):,.0f} B")
        prev = r
        keys = sum(k for k, _ in r["state"].values())
        size = sum(b for _, b in r["state"].values())
        growth = (r["rss_kib"] - r["idle_kib"]) * 1024 / r["series"]
        drops = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(r["dropped"].items()) if v) or "none"
        rows.append(f"| {r['series']:,} | {r['rate']:,.0f} ({r['warm']:,.0f}) | {r['rss_kib'] / 1024:,.0f} ({r['idle_kib'] / 1024:,.0f}) "
                    f"| {growth:,.0f} B | {marginal} | {keys:,} | {size / 2**20:,.1f} | {size / max(keys, 1):,.0f} B "
                    f"| {size / r['series']:,.0f} B | {drops} |")
    per_handler = ["", "changelog per handler (keys, bytes per key): " + "; ".join(
        f"{r['series']:,} series: " + ", ".join(f"{h} {k:,} × {b / max(k, 1):,.0f} B"
                                                for h, (k, b) in sorted(r["state"].items()))
        for r in results)]
    return "\n".join([head, *rows, *per_handler])


def run(quick: bool = False) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    idle = None
    for n in QUICK_SIZES if quick else SIZES:
        r = one_size(n, idle)
        idle = r["idle_kib"]
        results.append(r)
    print(table(results), flush=True)
    rows: list[dict[str, Any]] = []
    base = results[0]
    for r in results:
        keys = sum(k for k, _ in r["state"].values())
        size = sum(b for _, b in r["state"].values())
        drops = sum(r["dropped"].values())
        label = f"{r['series']:,} series"
        rows += [
            {"benchmark": f"stream cost per series, {label}", "metric": "samples/s", "value": round(r["rate"]),
             "baseline": f"{base['series']:,} series (same run; 2 shared cores)", "baseline_value": round(base["rate"]),
             "ratio": round(r["rate"] / base["rate"], 3) if base["rate"] else 0.0, "unit": "samples/s",
             "target": "report", "ok": None},
            {"benchmark": f"stream cost per series, {label}", "metric": "samples/s after the 1st round",
             "value": round(r["warm"]), "baseline": f"{base['series']:,} series, same", "baseline_value":
             round(base["warm"]), "ratio": round(r["warm"] / base["warm"], 3) if base["warm"] else 0.0,
             "unit": "samples/s", "target": "report", "ok": None},
            {"benchmark": f"stream cost per series, {label}", "metric": "RSS growth per series",
             "value": round((r["rss_kib"] - r["idle_kib"]) * 1024 / r["series"]),
             "baseline": "idle worker RSS (MiB)", "baseline_value": round(r["idle_kib"] / 1024),
             "ratio": round(r["rss_kib"] / r["idle_kib"], 2), "unit": "B/series", "target": "report", "ok": None},
            {"benchmark": f"stream cost per series, {label}", "metric": "detector state in changelog per series",
             "value": round(size / r["series"]), "baseline": "bytes per state key", "baseline_value":
             round(size / max(keys, 1)), "ratio": 0.0, "unit": "B/series", "target": "report", "ok": None},
            {"benchmark": f"stream cost per series, {label}", "metric": "state keys dropped (caps/TTLs)",
             "value": round(drops), "baseline": "changelog keys", "baseline_value": keys, "ratio": 0.0,
             "unit": "keys", "target": "bounded by caps", "ok": None},
        ]
    return rows


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  python -m bench.bench_stream_series --quick\n"
                                        "  python -m bench --only stream_series")
    ap.add_argument("--quick", action="store_true", help="10k and 100k series only")
    for row in run(quick=ap.parse_args().quick):
        print(row)
