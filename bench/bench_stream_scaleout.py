"""Scale-out of the stream stage: 1, 2 and 3 workers of one app on one broker with 12 partitions.

Throughput: for k = 1, 2, 3, on a fresh broker (five telemetry topics of 12 partitions), k workers of
one app start together and join (the group Stable, every worker assigned); then rounds of a fleet
(``bench/stream_workload.py``, every handler on) are sent and the workers are timed from the first
counted sample to the last (each worker's ``opsloop_stream_samples_total``): samples/s in total and
per worker.

Join: live rounds arrive at a steady rate while 2 workers keep up; a third joins. The consumer group's
lag (records between the topics' ends and the committed offsets, polled every 0.5 s) before, at
its peak during the rebalance, and the seconds until it is back to its level before the join.

The machine has 2 shared cores: three workers share them, so the total cannot grow with the workers
here; per-worker figures and the join's lag are what carry over to a machine with a core per worker.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.bench_stream_fleet import TOPICS, Worker, kafka_stack, produce
from bench.stream_workload import Fleet, fleet_round
from opsloop.kafka_admin import ensure_topics

PARTITIONS = 12
LIVE_FLEET = Fleet(lbs=20, hosts=200, hypervisors=150, keystones=3, netperf_sets=2)   # ~10.6k samples a round


def start_together(workers: list[Worker]) -> None:
    threads = [threading.Thread(target=w.start) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def members(bootstrap: str, group: str) -> int:
    """Members of a Stable consumer group that have partitions assigned (0 while it rebalances)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        desc = admin.describe_groups([group])[group]
    except Exception:  # noqa: BLE001 - coordinator not ready yet
        return 0
    finally:
        admin.close()
    if desc.get("error") or desc.get("group_state") != "Stable":
        return 0
    return sum(1 for m in desc["members"] if (m.get("member_assignment") or {}).get("assigned_partitions"))


def throughput(tmp: Path, k: int, fleet: Fleet, rounds: int) -> dict[str, Any]:
    """k workers of a new app on a fresh broker: they join first (group Stable, every worker assigned),
    then the rounds are sent and timed from the first counted sample to the last."""
    stack = kafka_stack(tmp / f"scale{k}")
    stack.up()
    app = f"scale{k}-{uuid.uuid4().hex[:6]}"
    workers: list[Worker] = []
    try:
        ensure_topics(stack.kafka_bootstrap, PARTITIONS, 1)
        workers = [Worker(tmp, stack.kafka_bootstrap, app_id=app, name=f"{app}-{i}", partitions=PARTITIONS)
                   for i in range(k)]
        start_together(workers)
        deadline = time.monotonic() + 180
        while members(stack.kafka_bootstrap, app) < k and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(3)   # the table recoveries after the assignment (empty changelogs)
        records = [r for n in range(rounds) for r in fleet_round(fleet, n, time.time() - 3600 - rounds * 15)]
        n_samples = sum(v.count(b'"timestamp":') for _, _, v in records)   # once per sample
        feeder = threading.Thread(target=produce, args=(stack.kafka_bootstrap, records))
        t_send = time.perf_counter()
        feeder.start()
        t_first = None
        first: list[float] = []
        counts: list[float] = [0.0] * k
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            counts = [w.samples() for w in workers]
            if t_first is None and sum(counts) > 0:
                t_first, first = time.perf_counter(), counts
            if sum(counts) >= n_samples:
                break
            time.sleep(0.25)
        elapsed = time.perf_counter() - (t_first or time.perf_counter())
        feeder.join()
        per = [(c - f) / elapsed if elapsed > 0 else 0.0 for c, f in zip(counts, first or counts)]
        return {"k": k, "total": sum(per), "per_worker": per, "seconds": elapsed,
                "send_s": None if t_first is None else t_first - t_send, "samples": n_samples}
    finally:
        for w in workers:
            w.stop()
        stack.down()


def group_lag(bootstrap: str, group: str, consumer: Any, admin: Any) -> int:
    from kafka import TopicPartition

    committed = admin.list_group_offsets(group)[group]
    parts = [TopicPartition(t, p) for t in TOPICS for p in range(PARTITIONS)]
    ends = consumer.end_offsets(parts)
    lag = 0
    for tp in parts:
        c = committed.get(tp)
        lag += ends[tp] - (c.offset if c is not None and c.offset >= 0 else 0)
    return lag


def join_lag(tmp: Path, bootstrap: str, seconds_before: float, seconds_after: float) -> dict[str, Any]:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    app = f"join-{uuid.uuid4().hex[:6]}"
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=1 << 20,
                             max_request_size=8 << 20)
    stop = threading.Event()
    t0 = time.time()

    def live() -> None:   # one round of LIVE_FLEET every 2 s
        n = 0
        while not stop.is_set():
            t = time.monotonic()
            for topic, key, value in fleet_round(LIVE_FLEET, n, t0):
                producer.send(topic, key=key, value=value)
            producer.flush()
            n += 1
            stop.wait(max(0.0, 2.0 - (time.monotonic() - t)))

    probe = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    workers = [Worker(tmp, bootstrap, app_id=app, name=f"{app}-{i}", partitions=PARTITIONS) for i in range(3)]
    feeder = threading.Thread(target=live, daemon=True)
    try:
        start_together(workers[:2])
        feeder.start()
        time.sleep(5)   # the first rounds, the group settled
        series: list[tuple[float, int]] = []
        t_join = time.monotonic() + seconds_before
        joined = threading.Thread(target=workers[2].start)
        joiner_first: float | None = None   # when the joining worker counted its first sample
        while time.monotonic() < t_join + seconds_after:
            if not joined.is_alive() and time.monotonic() >= t_join and not workers[2].proc.running():
                joined.start()
            if joiner_first is None and not joined.is_alive() and time.monotonic() >= t_join:
                try:
                    if workers[2].samples() > 0:
                        joiner_first = time.monotonic() - t_join
                except Exception:  # noqa: BLE001 - its metrics server is not up yet
                    pass
            try:
                series.append((time.monotonic() - t_join, group_lag(bootstrap, app, probe, admin)))
            except Exception:  # noqa: BLE001 - the coordinator is busy with the rebalance: next poll
                pass
            time.sleep(0.5)
        joined.join()
    finally:
        stop.set()
        feeder.join(timeout=10)
        for w in workers:
            w.stop()
        producer.close()
        probe.close()
        admin.close()
    before = [lag for t, lag in series if t < 0]
    after = [(t, lag) for t, lag in series if t >= 0]
    base = statistics.median(before) if before else 0
    peak_t, peak = max(after, key=lambda x: x[1]) if after else (0.0, 0)
    round_records = sum(1 for _ in fleet_round(LIVE_FLEET, 0, t0))
    # back to normal: no more behind than the round in flight
    settle = next((t for t, lag in after if t > peak_t and lag <= max(base, round_records)), None)
    return {"before": base, "peak": peak, "peak_at_s": peak_t, "settled_s": settle,
            "round_records": round_records, "joiner_first_s": joiner_first, "series": series}


def run(quick: bool = False) -> list[dict[str, Any]]:
    fleet = Fleet()
    rounds = 10 if quick else 30
    with tempfile.TemporaryDirectory(prefix="opsloop-bench-") as d:
        tmp = Path(d)
        curve = [throughput(tmp, k, fleet, rounds) for k in (1, 2, 3)]
        print("scale-out: " + "; ".join(f"{c['k']} worker(s): {c['total']:,.0f} samples/s total, per worker "
                                        + "/".join(f"{x:,.0f}" for x in c["per_worker"]) for c in curve), flush=True)
        stack = kafka_stack(tmp / "join")   # empty topics: the joining group sees the live rounds only
        stack.up()
        try:
            ensure_topics(stack.kafka_bootstrap, PARTITIONS, 1)
            join = join_lag(tmp, stack.kafka_bootstrap, 10 if quick else 15, 30 if quick else 45)
        finally:
            stack.down()
    one = curve[0]["total"]
    print(f"join: lag before {join['before']:,.0f} records, peak {join['peak']:,.0f} at +{join['peak_at_s']:.1f} s, "
          f"settled at +{join['settled_s']} s, the joining worker's first sample at +{join['joiner_first_s']} s "
          f"(started at +0; a round is {join['round_records']} records every 2 s)", flush=True)
    rows = [{"benchmark": f"stream scale-out, {c['k']} worker(s), 12 partitions", "metric": "samples/s total",
             "value": round(c["total"]), "baseline": "1 worker (same run; 2 shared cores)", "baseline_value": round(one),
             "ratio": round(c["total"] / one, 3) if one else 0.0, "unit": "samples/s", "target": "report", "ok": None}
            for c in curve]
    rows += [{"benchmark": f"stream scale-out, {c['k']} worker(s), 12 partitions", "metric": "samples/s per worker",
              "value": round(c["total"] / c["k"]), "baseline": "1 worker (same run)", "baseline_value": round(one),
              "ratio": round(c["total"] / c["k"] / one, 3) if one else 0.0, "unit": "samples/s", "target": "report",
              "ok": None} for c in curve[1:]]
    rows.append({"benchmark": "stream scale-out, 3rd worker joins 2 under live load", "metric": "peak group lag",
                 "value": round(join["peak"]), "baseline": "lag before the join (median)",
                 "baseline_value": round(join["before"]), "ratio": 0.0, "unit": "records", "target": "report",
                 "ok": None})
    rows.append({"benchmark": "stream scale-out, 3rd worker joins 2 under live load", "metric": "back to the lag before",
                 "value": round(join["settled_s"], 1) if join["settled_s"] is not None else "not within the run",
                 "baseline": "peak at (s after the join)", "baseline_value": round(join["peak_at_s"], 1), "ratio": 0.0,
                 "unit": "s after the join", "target": "report", "ok": None})
    return rows


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  python -m bench.bench_stream_scaleout --quick\n"
                                        "  python -m bench --only stream_scaleout")
    ap.add_argument("--quick", action="store_true", help="8 rounds of backlog, a shorter join")
    for row in run(quick=ap.parse_args().quick):
        print(row)
