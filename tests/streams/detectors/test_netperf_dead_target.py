"""The netperf detector reads a set result that left a dead target out (the collector's ``dead_targets``/``dead``:
``mean_gbps`` over the targets that answered, see collectors/netperf/README.md).

Before, every result with ``failed_targets`` > 0 was skipped: with one target dead for good, the set's throughput
gauge froze at its last value and a real regression of the set was never found, for as long as the target stayed
dead. Now such a result is compared with the baseline (a finding names the dead targets), shown, and its dead
targets exported (``opsloop_netperf_dead_targets``); it does not join the baseline, which stays the whole set's.
A result of an older collector (failures, no ``dead_targets``) is still skipped.
"""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from opsloop.records import Metric, metric
from opsloop.streams.detectors.netperf.detector import NetperfResult, result_from_metric
from opsloop.streams.detectors.netperf.handler import BYTES_PER_GBIT, NetperfHandler

T0 = 1_796_000_000.0
DEAD = "10.0.8.13:12866"


def result(target_set: str, gbps: float, ts: float, dead: int = 0, **extra: object) -> Metric:
    fields: dict[str, object] = {"mean_gbps": gbps, "runs": 10, "complete_runs": 10, "targets": 6,
                                 "failed_targets": dead, "failed": DEAD if dead else "", "dead_targets": dead,
                                 "dead": DEAD if dead else "", **extra}
    return metric("netperf_throughput", fields,   # type: ignore[arg-type]
                  {"host": "bench-1", "target_set": target_set, "driver": "netperf", "test": "TCP_STREAM",
                   "queues": "8", "kernel": "4.4"}, ts)


def labels(target_set: str) -> dict[str, str]:
    return {"target_set": target_set, "label": "driver=netperf,kernel=4.4,test=TCP_STREAM", "queues": "8"}


def test_a_result_with_a_dead_target_is_shown_compared_and_its_dead_target_exported() -> None:
    h, ts = NetperfHandler(), "dead-" + str(T0)
    h.handle([result(ts, 8.42, T0)], T0)
    h.handle([result(ts, 8.30, T0 + 3600, dead=1)], T0 + 3600)
    assert h.drain_outbox() == []
    # before: skipped, the gauge stayed at 8.42 and no dead-target gauge
    assert REGISTRY.get_sample_value("opsloop_netperf_throughput_bytes_per_second", labels(ts)) == \
        pytest.approx(8.30 * BYTES_PER_GBIT)
    assert REGISTRY.get_sample_value("opsloop_netperf_dead_targets", labels(ts)) == 1
    # the regression while the target is still dead: found, the finding saying what it was measured over
    h.handle([result(ts, 3.5, T0 + 7200, dead=1)], T0 + 7200)
    [(event, finding)] = h.drain_outbox()
    assert event == "opened" and finding.detector == "netperf.throughput_drop"
    assert finding.expected == pytest.approx(8.42)   # the dead-target result of 8.30 did not join the baseline
    assert f"measured over 5 of 6 targets, 1 dead (answered in no run): {DEAD}" in finding.explanation
    # the target back, the throughput too: cleared, the gauge back at 0
    h.handle([result(ts, 8.40, T0 + 10800)], T0 + 10800)
    assert [e for e, _ in h.drain_outbox()] == ["cleared"]
    assert REGISTRY.get_sample_value("opsloop_netperf_dead_targets", labels(ts)) == 0


def test_a_dead_target_result_does_not_seed_the_baseline() -> None:
    h, ts = NetperfHandler(), "seed-" + str(T0)
    h.handle([result(ts, 4.0, T0, dead=1)], T0)
    h.handle([result(ts, 8.42, T0 + 3600)], T0 + 3600)   # the whole set's first result is the baseline
    h.handle([result(ts, 3.5, T0 + 7200)], T0 + 7200)
    [(event, finding)] = h.drain_outbox()
    assert event == "opened" and finding.expected == pytest.approx(8.42)


def test_an_older_collectors_result_with_failures_is_still_skipped() -> None:
    old = result("old", 1.0, T0, dead=1)
    del old.fields["dead_targets"], old.fields["dead"]
    assert result_from_metric(old) is None
    # a flaky target (failed in some runs, dead in none): mean_gbps is made of the complete runs alone
    r = result_from_metric(result("flaky", 8.1, T0, failed_targets=1))
    assert r is not None and r.gbps == 8.1 and r.dead_targets == 0


@pytest.mark.parametrize("bad", [{"dead_targets": "one"}, {"dead_targets": True}, {"dead_targets": -1},
                                 {"dead_targets": 1.5}, {"dead_targets": float("inf")}, {"targets": float("nan")},
                                 {"dead_targets": 6}])
def test_dead_target_counts_that_are_no_counts_are_refused(bad: dict[str, object]) -> None:
    m = result("bad", 8.0, T0, dead=1)
    m.fields.update(bad)   # type: ignore[arg-type]
    with pytest.raises(ValueError, match="netperf result"):
        result_from_metric(m)
    h = NetperfHandler()
    h.handle([m], T0)
    assert h.rejected == 1 and h.drain_outbox() == []


def test_a_plain_mapping_without_the_fields_reads_as_before() -> None:
    r = NetperfResult.from_mapping({"target_set": "s", "label": "l", "queues": 8, "throughput_gbps": 8.4,
                                    "timestamp": T0})
    assert (r.targets, r.dead_targets, r.dead, r.measured_over) == (None, 0, "", "")
