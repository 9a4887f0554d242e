"""Isolation of a handler failure by units: a handler that reads several samples as one whole (a hypervisor's
round) names them with ``isolation_key``, and after a failure it is handed them back together, never one at a
time; a poison sample costs its unit. Handlers without the hook are handed one sample at a time as before.
The bounds stay: at most MAX_ISOLATED_FAILURES samples dead-lettered one by one, retries stop after as many
failed units, and the rest is counted in one summary."""

from __future__ import annotations

import time
from typing import Hashable, Sequence

from bench.stream_workload import Msg
from opsloop.records import Metric, metric
from opsloop.streams.runtime.batch import MAX_ISOLATED_FAILURES, FanOut, decode_and_handle, isolate
from opsloop.wire import encode_batch

NOW = time.time()


def _part(groups: int, per_group: int, poison: set[int] = frozenset()) -> list[Metric]:   # type: ignore[assignment]
    """Samples of ``groups`` rounds interleaved (as several records' runs of one name are in a batch)."""
    return [metric("unit_test", {"i": i}, {"host": f"h{g}", **({"poison": "1"} if g in poison else {})}, NOW)
            for i in range(per_group) for g in range(groups)]


class Grouped:
    """Reads a host's samples of one time as one round: it fails when a round comes in pieces."""

    name = "grouped"

    def __init__(self, per_group: int, fail_all: bool = False) -> None:
        self.per_group = per_group
        self.fail_all = fail_all
        self.calls: list[list[tuple[str, int]]] = []
        self.rounds: set[str] = set()

    @staticmethod
    def isolation_key(m: Metric) -> Hashable:
        return m.tags["host"], m.timestamp

    def handle(self, metrics: Sequence[Metric], now: float) -> None:
        self.calls.append([(m.tags["host"], m.fields["i"]) for m in metrics])
        if self.fail_all or any(m.tags.get("poison") for m in metrics):
            raise ValueError("cannot handle this round")
        counts: dict[str, int] = {}
        for m in metrics:
            counts[m.tags["host"]] = counts.get(m.tags["host"], 0) + 1
        assert all(c == self.per_group for c in counts.values()), f"a round in pieces: {counts}"
        self.rounds |= set(counts)


def test_a_failing_batch_is_handed_back_by_unit_and_a_poison_costs_its_unit() -> None:
    h = Grouped(per_group=4)
    part = _part(5, 4, poison={2})
    failures = isolate(h, part, NOW, "ValueError: first try")
    assert h.rounds == {"h0", "h1", "h3", "h4"}
    # units in the order of their first sample, each whole and in batch order
    assert [c[0][0] for c in h.calls] == ["h0", "h1", "h2", "h3", "h4"]
    assert h.calls[2] == [("h2", i) for i in range(4)]
    named = [(f.sample.tags["host"], f.sample.fields["i"]) for f in failures if f.sample]
    assert named == [("h2", i) for i in range(4)]
    assert all("reads as one unit" in f.error and f.error.startswith("ValueError: cannot handle this round")
               for f in failures)


def test_a_handler_without_the_hook_is_handed_one_sample_at_a_time() -> None:
    class Plain:
        name = "plain"

        def __init__(self) -> None:
            self.sizes: list[int] = []

        def handle(self, metrics: Sequence[Metric], now: float) -> None:
            self.sizes.append(len(metrics))
            if any(m.tags.get("poison") for m in metrics):
                raise ValueError("poison")

    h = Plain()
    failures = isolate(h, _part(3, 2, poison={1}), NOW, "x")
    assert h.sizes == [1] * 6
    assert [(f.sample.tags["host"], f.error) for f in failures if f.sample] == [("h1", "ValueError: poison")] * 2


def test_a_large_failing_unit_does_not_stop_the_others_and_its_dead_letters_stay_bounded() -> None:
    per = MAX_ISOLATED_FAILURES + 10
    h = Grouped(per_group=per)
    part = _part(40, per, poison={0})
    failures = isolate(h, part, NOW, "x")
    assert len(h.rounds) == 39   # every other round handled, past the first unit's 30 failed samples
    *named, summary = failures
    assert len(named) == MAX_ISOLATED_FAILURES and all(f.sample is not None for f in named)
    assert summary.sample is None and summary.not_retried == 10
    assert "10 of them not dead-lettered one by one" in summary.error and "not retried" not in summary.error


def test_a_handler_failing_on_every_unit_is_retried_a_bounded_number_of_times() -> None:
    h = Grouped(per_group=3, fail_all=True)
    part = _part(50, 3)
    failures = isolate(h, part, NOW, "x")
    assert len(h.calls) == MAX_ISOLATED_FAILURES
    *named, summary = failures
    assert len(named) == MAX_ISOLATED_FAILURES
    # every sample is either named or counted: 20 named, 40 of the failed units unnamed, 90 not retried
    assert summary.not_retried == len(part) - MAX_ISOLATED_FAILURES
    assert summary.error == (f"failed on {MAX_ISOLATED_FAILURES * 3} samples of this batch, "
                             f"{MAX_ISOLATED_FAILURES * 2} of them not dead-lettered one by one; "
                             f"the next {len(part) - MAX_ISOLATED_FAILURES * 3} were not retried")


def test_a_hook_that_raises_leaves_that_sample_alone_and_isolation_goes_on() -> None:
    class Picky(Grouped):
        @staticmethod
        def isolation_key(m: Metric) -> Hashable:
            if m.fields["i"] == 1:
                raise KeyError("no round")
            return m.tags["host"]

        def handle(self, metrics: Sequence[Metric], now: float) -> None:
            self.calls.append([(m.tags["host"], m.fields["i"]) for m in metrics])

    h = Picky(per_group=3)
    assert len(isolate(h, _part(2, 3), NOW, "first")) == 1   # nothing failed again: the batch as a whole
    assert sorted(len(c) for c in h.calls) == [1, 1, 2, 2]


def test_through_the_runtime_the_poison_unit_is_dead_lettered_with_its_records() -> None:
    h = Grouped(per_group=4)
    msgs = []
    for g in range(6):
        rows = [metric("unit_test", {"i": i}, {"host": f"h{g}", **({"poison": "1"} if g == 3 else {})}, NOW)
                for i in range(4)]
        msgs.append(Msg("telemetry.unit", 0, 100 + g, f"h{g}".encode(), encode_batch(rows)))
    batch = decode_and_handle("units", msgs, FanOut("units", [h]))
    assert [(d.offset, d.value["fields"]["i"]) for d in batch.deadletters] == [(103, i) for i in range(4)]
    assert h.rounds == {"h0", "h1", "h2", "h4", "h5"}
