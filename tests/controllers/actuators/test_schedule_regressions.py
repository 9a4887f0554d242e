"""What the seeded schedules (``test_schedule_faults.py``) found, one case each: an unreadable health
view taken as "nothing DOWN", a failed ``set weight`` left at its new weight while the batch said
"undone", a decision that is no share distribution applied, and a new epoch's noop never audited."""

from __future__ import annotations

import random
import time
from pathlib import Path

from opsloop.records import EdgeWeights

from opsloop.controllers.actuators.applier import EdgeActuator
from tests.controllers.actuators.support import ListSink
from tests.controllers.actuators.test_schedule_faults import (EDGE, LISTENER, FakeLvs, FakeRuntime, Plan,
                                                             make)


def decision(version: int, weights: dict[str, float], epoch: int = 0) -> EdgeWeights:
    return EdgeWeights(version=version, epoch=epoch, listener=LISTENER, edge=EDGE, weights=weights,
                       computed_at=1_800_000_000.0, reason=f"v{version}")


def actuator(kind: str, tmp: Path, start: dict[str, int]) -> tuple[EdgeActuator, FakeRuntime | FakeLvs, ListSink]:
    act, lb, sink = make(kind, tmp, random.Random(0), max_step=1.0)
    if isinstance(lb, FakeRuntime):
        lb.weights = dict(start)
    else:
        for o, w in start.items():
            lb.set_live(o, w)
    act.clock = lambda: 1_800_000_001.0
    return act, lb, sink


def test_haproxy_show_stat_failing_does_not_move_every_share_onto_a_server_in_maintenance(tmp_path: Path) -> None:
    act, lb, sink = actuator("haproxy", tmp_path, {"a": 0, "b": 0, "c": 256, "d": 0})
    assert isinstance(lb, FakeRuntime)
    lb.status["a"] = "MAINT"
    lb.plan = Plan(at={4: "hang_before"})          # 4 get weight, then show stat times out
    r = act.apply(decision(1, {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0}))
    assert r.result == "failed" and "show stat" in r.reason, r.reason
    assert lb.weights == {"a": 0, "b": 0, "c": 256, "d": 0} and lb.sets == []   # c (UP) still serves
    assert sink.results == ["failed"]


def test_lvs_listing_failing_in_the_health_read_does_not_revive_a_quiesced_real(tmp_path: Path) -> None:
    act, lb, sink = actuator("lvs", tmp_path, {"a": 1, "b": 1, "c": 1, "d": 1})
    assert act.apply(decision(1, {"a": 0.5, "b": 0.5, "c": 0.0, "d": 0.0})).result == "applied"
    lb.set_live("a", 0)                             # keepalived: a's health check failed
    lb.plan = Plan(at={1: "refuse"})                # the read works, the quiesce check's listing fails
    r = act.apply(decision(2, {"a": 0.6, "b": 0.4, "c": 0.0, "d": 0.0}))
    assert r.result == "failed" and lb.weights["a"] == 0, (r.result, lb.weights)
    lb.plan = Plan(at={1: "hang_before"})           # reconcile: the same
    assert act.reconcile() is None and lb.weights == {"a": 0, "b": 500, "c": 0, "d": 0}


def test_a_set_weight_that_timed_out_after_taking_effect_is_reset_with_the_rest(tmp_path: Path) -> None:
    act, lb, sink = actuator("haproxy", tmp_path, {"a": 200, "b": 56, "c": 0, "d": 0})
    # reads 0-3, show stat 4, the write's reads 5-8, then set c (increase) 9, b 10, d 11, a (decrease) 12
    lb.plan = Plan(at={12: "hang_after"})
    r = act.apply(decision(1, {"a": 0.0, "b": 56 / 256, "c": 200 / 256, "d": 0.0}))
    assert r.result == "failed"
    # before: a stayed at 0 and c was undone, all traffic on b, while the record said "undone: ['c', ...]"
    assert lb.weights == {"a": 200, "b": 56, "c": 0, "d": 0}, (lb.weights, r.reason)
    assert "'a' reset to 200" in r.reason


def test_a_decision_that_is_no_distribution_is_refused_and_nothing_written(tmp_path: Path) -> None:
    act, lb, sink = actuator("haproxy", tmp_path, {"a": 64, "b": 64, "c": 64, "d": 64})
    for weights in ({"a": 1e308, "b": 1e308}, {"a": -0.5, "b": 1.5}, {"a": 2.0, "b": -1.0},
                    {"a": float("nan"), "b": 1.0}, {"a": 0.2, "b": 0.2}):
        bad = EdgeWeights.model_construct(version=1, epoch=0, listener=LISTENER, edge=EDGE, weights=weights,
                                          computed_at=time.time(), reason="bug", inputs_age_s=0.0, shed={},
                                          mode=EdgeWeights.model_fields["mode"].default)
        act.clock = time.time
        r = act.apply(bad)
        assert r.result == "refused", (weights, r.result, r.reason)
    assert lb.sets == [] and lb.weights == {"a": 64, "b": 64, "c": 64, "d": 64}


def test_a_new_epochs_noop_is_audited_once_even_if_an_old_epoch_had_the_same_version(tmp_path: Path) -> None:
    act, lb, sink = actuator("haproxy", tmp_path, {"a": 64, "b": 64, "c": 64, "d": 64})
    even = {"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25}
    assert act.apply(decision(7, even)).result == "applied"
    assert act.apply(decision(7, even)).result == "noop"
    assert act.apply(decision(7, {"a": 0.5, "b": 0.5, "c": 0.0, "d": 0.0}, epoch=1)).result == "applied"
    n = len(sink.records)
    assert act.apply(decision(7, {"a": 0.5, "b": 0.5, "c": 0.0, "d": 0.0}, epoch=1)).result == "noop"
    assert len(sink.records) == n + 1 and sink.records[-1].result == "noop"



def test_a_stale_copy_older_than_the_applied_version_is_a_stale_version_not_a_fail_static(tmp_path: Path) -> None:
    """A restart's backlog read over several polls handed the actuator old, stale copies after a newer
    version was applied: each was ``held`` (stale) and put the slot into fail static, an edge.fail_static
    finding opened and cleared by the next poll's decision (helper schedule, test_schedule_service.py)."""
    act, lb, sink = actuator("haproxy", tmp_path, {"a": 64, "b": 64, "c": 64, "d": 64})
    even = {"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25}
    assert act.apply(decision(5, even)).result == "applied"
    written = list(lb.sets)
    act.clock = lambda: 1_800_000_000.0 + 3600          # both copies now an hour old
    old = act.apply(decision(3, {"a": 0.5, "b": 0.5, "c": 0.0, "d": 0.0}))
    assert (old.result, old.stale) == ("stale_version", False), (old.result, old.reason)
    same = act.apply(decision(5, even))                 # the applied version itself, stale: fail static
    assert (same.result, same.stale) == ("held", True)
    assert lb.sets == written and lb.weights == {"a": 64, "b": 64, "c": 64, "d": 64}   # nothing written
