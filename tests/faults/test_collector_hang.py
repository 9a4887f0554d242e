"""A collector whose collect() hangs (a socket read without a timeout, a stuck tool) or raises each round.

The contract asks collectors to bound their own rounds; a bug that breaks it must not stall the
runtime: the loop must keep ticking, a stop (SIGTERM) must still end the loop, the hang
is counted once (``opsloop_collector_errors_total{kind="timeout"}``) and logged, and the late round
is published when it returns.
"""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY

from opsloop.collect import Round
from opsloop.collect.runner import run_loop
from opsloop.records import Metric, metric
from tests.helpers import unique, wait_until


class HangsOnce:
    def __init__(self, name: str) -> None:
        self.name = name
        self.release = threading.Event()
        self.calls = 0

    def collect(self) -> Round:
        self.calls += 1
        if self.calls == 1:
            self.release.wait()          # hangs until the test lets it go
        return Round([metric("lb_fault_hang", {"call": self.calls}, {"host": self.name})])


class RaisesAlways:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def collect(self) -> Round:
        self.calls += 1
        raise KeyError("a bug in the collector")


class Recorder:
    """Stands in for the Publisher: what each tick handed over."""

    def __init__(self) -> None:
        self.rounds: list[list[Metric]] = []

    def publish_metrics(self, metrics: list[Metric]) -> None:
        self.rounds.append(list(metrics))


def errors(name: str, kind: str) -> float:
    return REGISTRY.get_sample_value("opsloop_collector_errors_total", {"collector": name, "kind": kind}) or 0.0


def start(collector: object, publisher: Recorder) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    t = threading.Thread(target=run_loop, args=(collector,), daemon=True,
                         kwargs=dict(interval_s=0.1, publisher=publisher, stop=stop))
    t.start()
    return t, stop


def test_a_hanging_collect_does_not_stall_the_loop_and_is_counted_once() -> None:
    c, pub = HangsOnce(unique("hang")), Recorder()
    loop, stop = start(c, pub)
    try:
        wait_until(lambda: len(pub.rounds) >= 5, timeout=20, interval=0.05, what="ticks while collect() hangs")
        assert c.calls == 1                      # never a second collect() beside the hung one
        assert all(r == [] for r in pub.rounds)  # the loop still ticks (empty rounds) beside the hung one
        assert errors(c.name, "timeout") == 1
        assert REGISTRY.get_sample_value("opsloop_collector_overruns_total", {"collector": c.name}) == 1
        c.release.set()
        wait_until(lambda: [m.fields["call"] for r in pub.rounds for m in r][:2] == [1, 2], timeout=20,
                   interval=0.05, what="the late round, then the next")
        assert errors(c.name, "timeout") == 1
    finally:
        c.release.set()
        stop.set()
        loop.join(timeout=20)
    assert not loop.is_alive()


def test_stop_ends_the_loop_while_collect_hangs() -> None:
    c, pub = HangsOnce(unique("hangstop")), Recorder()
    loop, stop = start(c, pub)
    wait_until(lambda: c.calls == 1, timeout=20, interval=0.05, what="the first collect()")
    stop.set()
    loop.join(timeout=20)
    alive = loop.is_alive()
    c.release.set()
    assert not alive, "SIGTERM would not end a collector whose collect() hangs"


def test_a_collect_that_raises_every_round_is_counted_and_the_loop_goes_on() -> None:
    c, pub = RaisesAlways(unique("raises")), Recorder()
    loop, stop = start(c, pub)
    try:
        wait_until(lambda: c.calls >= 3 and len(pub.rounds) >= 3, timeout=20, interval=0.05, what="three rounds")
        assert errors(c.name, "tool") >= 3
    finally:
        stop.set()
        loop.join(timeout=20)
    assert not loop.is_alive()
