"""A handler that raises on one sample of a batch (a poison sample): the worker goes on, only that sample
is dead-lettered (with its record's topic, partition and offset and the handler's error), the failing
handler still handles every other sample, and the other handlers never notice. A handler that fails on
every sample is not retried without bound: its dead letters stay few per batch."""

from __future__ import annotations

import time

from bench.stream_workload import Msg
from opsloop.records import metric
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.runtime.batch import MAX_ISOLATED_FAILURES, FanOut, decode_and_handle
from opsloop.wire import encode_batch

RECORDS, PER_RECORD = 50, 100
POISON = (7, 3)   # record, sample


class Poisoned:
    name = "poisoned"
    names = frozenset({"lb_poison_test"})

    def __init__(self, always: bool = False) -> None:
        self.always = always
        self.handled: set[tuple[str, float]] = set()

    def handle(self, metrics, now) -> None:  # type: ignore[no-untyped-def]
        for m in metrics:
            if self.always or m.tags.get("poison"):
                raise ValueError("cannot handle this sample")
        self.handled |= {(m.tags["host"], m.fields["v"]) for m in metrics}


class Counting:
    name = "counting"
    names = frozenset({"lb_poison_test"})

    def __init__(self) -> None:
        self.seen = 0

    def handle(self, metrics, now) -> None:  # type: ignore[no-untyped-def]
        self.seen += len(metrics)


def batch_of_records() -> list[Msg]:
    now = time.time()
    msgs = []
    for r in range(RECORDS):
        ms = [metric("lb_poison_test", {"v": i}, {"host": f"h{r}", **({"poison": "1"} if (r, i) == POISON else {})},
                     timestamp=now) for i in range(PER_RECORD)]
        msgs.append(Msg("telemetry.lb", 2, 1000 + r, f"h{r}".encode(), encode_batch(ms)))
    return msgs


def test_only_the_poison_sample_is_dead_lettered_and_every_other_sample_is_handled() -> None:
    poisoned, counting = Poisoned(), Counting()
    batch = decode_and_handle("lb", batch_of_records(), FanOut("lb", [poisoned, counting]))
    assert counting.seen == RECORDS * PER_RECORD            # the other handler had the whole batch, once
    (dl,) = batch.deadletters
    assert dl.reason == "handler lb failed: poisoned: ValueError: cannot handle this sample"
    assert (dl.topic, dl.partition, dl.offset, dl.key) == ("telemetry.lb", 2, 1000 + POISON[0], b"h7")
    assert dl.value["tags"]["poison"] == "1" and dl.value["fields"] == {"v": POISON[1]}
    assert len(poisoned.handled) == RECORDS * PER_RECORD - 1   # the failing handler still had the rest


def test_a_handler_failing_on_every_sample_is_retried_a_bounded_number_of_times() -> None:
    broken, counting = Poisoned(always=True), Counting()
    batch = decode_and_handle("lb", batch_of_records(), FanOut("lb", [broken, counting]))
    assert counting.seen == RECORDS * PER_RECORD
    assert len(batch.deadletters) == MAX_ISOLATED_FAILURES + 1
    *samples, summary = batch.deadletters
    assert all(dl.offset is not None and dl.topic == "telemetry.lb" for dl in samples)
    assert summary.value == {"handler": "poisoned", "samples": RECORDS * PER_RECORD - MAX_ISOLATED_FAILURES}
    assert "were not retried" in summary.reason


def test_a_plain_handler_is_isolated_too() -> None:
    poisoned = Poisoned()
    batch = decode_and_handle("lb", batch_of_records(), poisoned)
    assert [dl.offset for dl in batch.deadletters] == [1000 + POISON[0]]
    assert len(poisoned.handled) == RECORDS * PER_RECORD - 1


def test_a_sample_a_detector_refuses_is_dead_lettered_with_its_record_and_the_rest_handled() -> None:
    """A sample of the right name that a detector cannot read (watts "n/a": valid on the wire, no
    power reading) is not a handler failure but is no silent drop either: counted, and dead-lettered
    with its record's topic, partition and offset and the detector's reason. A record of such samples
    gives a bounded number of dead letters (one summary for the rest); the good samples are handled."""
    now = time.time()
    bad = metric("ipmi_power", {"watts": "n/a"}, {"host": "h-bad"}, timestamp=now)
    good = metric("ipmi_power", {"watts": 136.0}, {"host": "h-ok"}, timestamp=now)
    msgs = [Msg("telemetry.ipmi", 1, 500, b"h-bad", encode_batch([bad, good]))]
    power = PowerHandler()
    batch = decode_and_handle("detectors", msgs, FanOut("detectors", [power]))
    (dl,) = batch.deadletters
    assert dl.reason.startswith("handler detectors rejected: power-detector: ") and "watts" in dl.reason
    assert (dl.topic, dl.partition, dl.offset, dl.key) == ("telemetry.ipmi", 1, 500, b"h-bad")
    assert dl.value["tags"] == {"host": "h-bad"} and power.rejected == 1
    assert "h-ok" in power.detector.sums

    flood = [metric("ipmi_power", {"watts": "n/a"}, {"host": f"h{i}"}, timestamp=now) for i in range(300)]
    batch = decode_and_handle("detectors", [Msg("telemetry.ipmi", 1, 501, b"x", encode_batch(flood))],
                              FanOut("detectors", [power]))
    *samples, summary = batch.deadletters
    assert len(samples) == MAX_ISOLATED_FAILURES and all(d.offset == 501 for d in samples)
    assert summary.value == {"handler": "power-detector", "samples": 300 - MAX_ISOLATED_FAILURES}
    assert power.rejected == 301
