"""The collection loop: one round per interval, never overlapping itself, errors counted by kind."""

from __future__ import annotations

import random
import sys
import threading
import time
from typing import IO

import orjson
from prometheus_client import Counter, Gauge, Histogram

from opsloop.collect.publisher import Publisher
from opsloop.collect.types import Collector, Round
from opsloop.log import get_logger

log = get_logger("collector")

ROUNDS = Counter("opsloop_collector_rounds_total", "Collection rounds run", ["collector"])
SAMPLES = Counter("opsloop_collector_samples_total", "Samples collected", ["collector"])
ERRORS = Counter("opsloop_collector_errors_total", "Per-target collection errors by kind", ["collector", "kind"])
ROUND_SECONDS = Histogram("opsloop_collector_round_seconds", "Duration of one collection round", ["collector"],
                          buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
LAST_ROUND = Gauge("opsloop_collector_last_round_timestamp_seconds", "End of the last round", ["collector"])
OVERRUNS = Counter("opsloop_collector_overruns_total", "Rounds that took longer than the interval", ["collector"])


def run_round(collector: Collector) -> Round:
    t0 = time.monotonic()
    rnd = collector.collect()
    ROUND_SECONDS.labels(collector.name).observe(time.monotonic() - t0)
    ROUNDS.labels(collector.name).inc()
    SAMPLES.labels(collector.name).inc(len(rnd.metrics))
    for err in rnd.errors:
        ERRORS.labels(collector.name, err.kind).inc()
        log.warning("target_failed", collector=collector.name, target=err.target, kind=err.kind, error=err.message)
    LAST_ROUND.labels(collector.name).set(time.time())
    return rnd


def print_round(rnd: Round, out: IO[str] = sys.stdout) -> None:
    for m in rnd.metrics:
        out.write(orjson.dumps(m.to_dict()).decode() + "\n")
    for e in rnd.errors:
        out.write(orjson.dumps({"error": {"target": e.target, "kind": e.kind, "message": e.message}}).decode() + "\n")
    out.flush()


def run_once(collector: Collector, *, publisher: Publisher | None = None, stdout: bool = False) -> Round:
    """One round for `opsloop collect --once`. Unlike :func:`run_loop`, which logs a failed round and goes
    on, this raises (``CollectorUnavailable`` and any other error): the caller exits non-zero."""
    rnd = run_round(collector)
    if stdout:
        print_round(rnd)
    if publisher is not None:
        publisher.publish_metrics(rnd.metrics)
    return rnd


def run_loop(collector: Collector, *, interval_s: float, publisher: Publisher | None = None,
             stdout: bool = False, once: bool = False, jitter_s: float = 0.0,
             stop: threading.Event | None = None, max_rounds: int | None = None) -> int:
    """Run rounds until ``stop`` is set (or once). Returns the number of rounds run."""
    stop = stop or threading.Event()
    rounds = 0
    next_at = time.monotonic() + (random.uniform(0, jitter_s) if jitter_s else 0.0)
    while not stop.is_set():
        delay = next_at - time.monotonic()
        if delay > 0 and stop.wait(delay):
            break
        started = time.monotonic()
        try:
            rnd = run_round(collector)
        except Exception as e:  # noqa: BLE001 - a collector bug must not stop the loop
            ERRORS.labels(collector.name, "tool").inc()
            log.error("round_failed", collector=collector.name, error=f"{type(e).__name__}: {e}")
            rnd = Round()
        if stdout:
            print_round(rnd)
        if publisher is not None:
            try:
                publisher.publish_metrics(rnd.metrics)  # an empty round still replays a due spool
            except Exception as e:  # noqa: BLE001 - publish never raises; this guards a bug in it
                ERRORS.labels(collector.name, "publish").inc()
                log.error("publish_failed", collector=collector.name, error=f"{type(e).__name__}: {e}")
        rounds += 1
        if once or (max_rounds is not None and rounds >= max_rounds):
            break
        # Fixed cadence; when a round overran, skip the missed ticks instead of bunching rounds.
        next_at += interval_s
        now = time.monotonic()
        if next_at < now:
            OVERRUNS.labels(collector.name).inc()
            log.warning("round_overrun", collector=collector.name, took_s=round(now - started, 3),
                        interval_s=interval_s)
            next_at = now + interval_s
        if jitter_s:
            next_at += random.uniform(-jitter_s, jitter_s) / 2
    return rounds
