"""`opsloop collect NAME --once` on a collector whose round hangs: it gives up after collector.timeout_s with
a TimeoutError naming the setting (the command then exits 1) instead of hanging; counted as a timeout."""

from __future__ import annotations

import threading

import pytest

from opsloop.collect.runner import ERRORS, run_once
from opsloop.collect.types import Round
from opsloop.records import metric


class Hanging:
    name = "hanging-once"

    def __init__(self) -> None:
        self.release = threading.Event()

    def collect(self) -> Round:
        self.release.wait(60)
        return Round()


class Quick:
    name = "quick-once"

    def collect(self) -> Round:
        return Round(metrics=[metric("haproxy", {"stot": 1}, {"host": "lb"})])


def test_a_hanging_round_gives_up_after_the_timeout_and_is_counted() -> None:
    collector = Hanging()
    counted = ERRORS.labels(collector.name, "timeout")
    before = counted._value.get()
    try:
        with pytest.raises(TimeoutError, match=r"collector\.timeout_s = 0\.2"):
            run_once(collector, timeout_s=0.2)
    finally:
        collector.release.set()
    assert counted._value.get() == before + 1


def test_a_round_within_the_timeout_is_returned() -> None:
    rnd = run_once(Quick(), timeout_s=30)
    assert [m.name for m in rnd.metrics] == ["haproxy"]
