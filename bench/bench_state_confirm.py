"""What the wait for the state writes' acknowledgements costs the stream worker (same run, same records).

The ``detectors`` agent acks a batch (its offsets committable) only once the broker has acknowledged the batch's
state (changelog) writes (``StatefulAgent.confirm_writes``): one wait per batch for the producer to send them and the
broker to answer, during which the agent handles nothing. Measured on the fleet workload of
``bench_stream_fleet`` (every handler on, ~1,100 state keys touched per round), taking turns on the same records:

* the **worker** as shipped (``opsloop stream worker``);
* the **baseline**: the same worker with the wait removed (``bench/confirm_off.py``: the writes are sent and never
  awaited, as before the wait existed; Faust's commit still waits for them to end).

Each worker has an app id of its own (its own group and changelog), so each reads every record and writes every
state. Samples/s from the worker's first counted sample to the last (``opsloop_stream_samples_total``, all topics).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.bench_stream_fleet import PARTITIONS, Worker, fleet_records, kafka_stack, produce, time_worker_cpu
from bench.stream_workload import Fleet
from opsloop.kafka_admin import ensure_topics

REPO = Path(__file__).resolve().parent.parent
TARGET_RATIO = 0.9   # the wait may cost at most a tenth of the throughput


def _measure(w: Worker, n_samples: int) -> tuple[float, float]:
    w.start()
    try:
        rate, _, cpu = time_worker_cpu(w, n_samples)
        return rate, cpu
    finally:
        w.stop()


def run(quick: bool = False) -> list[dict[str, Any]]:
    fleet = Fleet()
    n_rounds = 8 if quick else 60
    repeats = 1 if quick else 3
    with tempfile.TemporaryDirectory(prefix="opsloop-bench-") as d:
        tmp = Path(d)
        stack = kafka_stack(tmp)
        stack.up()
        try:
            ensure_topics(stack.kafka_bootstrap, PARTITIONS, 1)
            records = fleet_records(fleet, n_rounds, time.time() - 3600 - n_rounds * 15)
            n_samples = sum(len(orjson.loads(v)["metrics"]) for _, _, v in records)
            produce(stack.kafka_bootstrap, records)
            del records
            waits, nowaits, cpu_wait, cpu_nowait = [], [], [], []
            load = [os.getloadavg()[0]]
            for i in range(repeats):   # the machine is shared: take turns, compare medians
                off = Worker(tmp, stack.kafka_bootstrap, name=f"off{i}")
                off.proc.argv = [sys.executable, "-m", "bench.confirm_off", *off.proc.argv[5:]]
                off.proc.env = {"PYTHONPATH": str(REPO)}
                rate, cpu = _measure(off, n_samples)
                nowaits.append(rate)
                cpu_nowait.append(cpu)
                rate, cpu = _measure(Worker(tmp, stack.kafka_bootstrap, name=f"on{i}"), n_samples)
                waits.append(rate)
                cpu_wait.append(cpu)
                load.append(os.getloadavg()[0])
        finally:
            stack.down()
    wait, nowait = statistics.median(waits), statistics.median(nowaits)
    note = (f"{n_samples:,} samples, {fleet.series:,} series, median of {repeats}; 2 shared cores, "
            f"load average {min(load):.1f}-{max(load):.1f}")
    return [
        {"benchmark": "stream worker, state writes acknowledged per batch", "metric": "samples/s per worker",
         "value": round(wait), "baseline": f"same worker without the wait, same records ({note})",
         "baseline_value": round(nowait), "ratio": round(wait / nowait, 3) if nowait else 0.0, "unit": "samples/s",
         "target": f"ratio ≥ {TARGET_RATIO}", "ok": bool(nowait) and wait / nowait >= TARGET_RATIO},
        {"benchmark": "stream worker CPU per sample, state writes acknowledged", "metric": "CPU µs per sample",
         "value": round(statistics.median(cpu_wait) * 1e6, 2), "baseline": "same worker without the wait",
         "baseline_value": round(statistics.median(cpu_nowait) * 1e6, 2),
         "ratio": round(statistics.median(cpu_wait) / statistics.median(cpu_nowait), 3)
         if statistics.median(cpu_nowait) else 0.0, "unit": "µs", "target": "report", "ok": None},
    ]


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  python -m bench.bench_state_confirm --quick\n"
                                        "  python -m bench --only state_confirm")
    ap.add_argument("--quick", action="store_true", help="8 rounds of the fleet (60 otherwise), one turn each")
    for row in run(quick=ap.parse_args().quick):
        print(row)
