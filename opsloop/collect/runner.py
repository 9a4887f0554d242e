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
HUNG_AFTER_INTERVALS = 3   # a collect() running this many intervals is counted as hung (kind "timeout")
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


def run_once(collector: Collector, *, publisher: Publisher | None = None, stdout: bool = False,
             timeout_s: float | None = None) -> Round:
    """One round for `opsloop collect --once`. Unlike :func:`run_loop`, which logs a failed round and goes
    on, this raises (``CollectorUnavailable`` and any other error): the caller exits non-zero. A round
    still running after ``timeout_s`` (``collector.timeout_s``) raises :class:`TimeoutError`: a hung
    tool must not hang the command (the round's thread is a daemon and ends with the process)."""
    if timeout_s is None:
        rnd = run_round(collector)
    else:
        pending = _PendingRound(collector)
        if not pending.wait(time.monotonic() + timeout_s, threading.Event()):
            ERRORS.labels(collector.name, "timeout").inc()
            raise TimeoutError(f"collect() did not return within collector.timeout_s = {timeout_s:g} s")
        if pending.error is not None:
            raise pending.error
        rnd = pending.result or Round()
    if stdout:
        print_round(rnd)
    if publisher is not None:
        publisher.publish_metrics(rnd.metrics)
    return rnd


class _PendingRound:
    """One ``collect()`` in its own daemon thread: a collector that breaks its contract and hangs (a
    socket read without a timeout, a stuck tool) must not stall the loop, which still ends on a stop.
    There is never a second round beside a hung one."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.started = time.monotonic()
        self.done = threading.Event()
        self.result: Round | None = None
        self.error: Exception | None = None
        self.reported = False
        self.overran = False
        threading.Thread(target=self._run, name=f"collect-{collector.name}", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = run_round(self.collector)
        except Exception as e:  # noqa: BLE001 - handed to the loop, which counts and logs it
            self.error = e
        finally:
            self.done.set()

    def wait(self, deadline: float | None, stop: threading.Event) -> bool:
        """True when the round ended; False at ``deadline`` (None: no deadline) or on a stop."""
        while not self.done.is_set():
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if left <= 0 or stop.is_set():
                return False
            self.done.wait(min(0.5, left))
        return True

    def report_hung(self) -> None:
        """Counted (kind ``timeout``) and logged once per hung round."""
        if not self.reported:
            self.reported = True
            ERRORS.labels(self.collector.name, "timeout").inc()
            log.error("round_hung", collector=self.collector.name,
                      running_s=round(time.monotonic() - self.started, 3),
                      error=f"collect() has not returned after {HUNG_AFTER_INTERVALS} intervals; "
                            "no new round until it does")


def run_loop(collector: Collector, *, interval_s: float, publisher: Publisher | None = None,
             stdout: bool = False, once: bool = False, jitter_s: float = 0.0,
             stop: threading.Event | None = None, max_rounds: int | None = None) -> int:
    """Run rounds until ``stop`` is set (or once). Returns the number of rounds run."""
    stop = stop or threading.Event()
    # The collector's round and sample counters exist at 0 from the start: a collector whose every round
    # fails (its tool missing since the first start) otherwise exports no samples series, and the alert
    # that calls a collector blind (errors and no samples) finds nothing to compare against.
    ROUNDS.labels(collector.name)
    SAMPLES.labels(collector.name)
    rounds = 0
    pending: _PendingRound | None = None
    next_at = time.monotonic() + (random.uniform(0, jitter_s) if jitter_s else 0.0)
    while not stop.is_set():
        delay = next_at - time.monotonic()
        if delay > 0 and stop.wait(delay):
            break
        started = time.monotonic()
        pending = pending or _PendingRound(collector)
        if pending.wait(None if once else started + interval_s, stop):
            done, pending = pending, None
            rnd = done.result or Round()
            if done.error is not None:   # a collector bug must not stop the loop
                ERRORS.labels(collector.name, "tool").inc()
                log.error("round_failed", collector=collector.name,
                          error=f"{type(done.error).__name__}: {done.error}")
        elif stop.is_set():
            break
        else:
            # a slow round is published when it ends; one running for HUNG_AFTER_INTERVALS is reported
            if not pending.overran:
                pending.overran = True
                OVERRUNS.labels(collector.name).inc()
            if time.monotonic() - pending.started >= HUNG_AFTER_INTERVALS * interval_s:
                pending.report_hung()
            rnd = Round()
        if stdout:
            print_round(rnd)
        if publisher is not None:
            try:
                publisher.publish_metrics(rnd.metrics)  # hands the round over; never waits for the broker
            except Exception as e:  # noqa: BLE001 - publish never raises; this guards a bug in it
                ERRORS.labels(collector.name, "publish").inc()
                log.error("publish_failed", collector=collector.name, error=f"{type(e).__name__}: {e}")
        rounds += 1
        if once or (max_rounds is not None and rounds >= max_rounds):
            break
        # Fixed cadence; when a round overran, skip the missed ticks instead of bunching rounds.
        next_at += interval_s
        now = time.monotonic()
        if pending is not None:
            next_at = now   # the round still runs (its overrun counted above): waiting for it is the next tick
        elif next_at < now:
            OVERRUNS.labels(collector.name).inc()
            log.warning("round_overrun", collector=collector.name, took_s=round(now - started, 3),
                        interval_s=interval_s)
            next_at = now + interval_s
        if jitter_s:
            next_at += random.uniform(-jitter_s, jitter_s) / 2
    return rounds
