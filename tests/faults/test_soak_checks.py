"""The soak's own checks can fail: duplicate pages, an all-zero or over-large weight step, a lost sample
and a gap in a series are each reported (fed recorded shapes, no pipeline)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import orjson

from bench.bench_soak import POWER_VICTIM, QUICK, Soak, SoakResult, Kill, pct


def soak_with_pages(tmp_path: Path, notes: list[dict]) -> Soak:
    s = Soak(tmp_path, QUICK, echo=lambda _: None)
    s.hv = SimpleNamespace(host="hv1", victim="port-1")  # type: ignore[assignment]
    pages = s.run_dir / "pager" / "pages.jsonl"
    pages.parent.mkdir(parents=True)
    # What the lab pager writes: Alertmanager webhooks, and PagerDuty events (no "alerts") for the same page.
    lines = [{"receiver": "page", "notification": n} for n in notes]
    lines.append({"receiver": "pagerduty", "notification": {"event_action": "trigger", "dedup_key": "x"}})
    pages.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return s


def alert(status: str, **labels: str) -> dict:
    return {"status": status, "labels": labels}


def test_pages_counted_per_problem_and_a_second_firing_is_caught(tmp_path: Path) -> None:
    power = {"alertname": "PowerGenerationDeviation", "host": POWER_VICTIM}
    chain = {"alertname": "FirewallUnprotectedPort", "hypervisor": "hv1", "port": "port-1"}
    s = soak_with_pages(tmp_path, [
        {"status": "firing", "alerts": [alert("firing", **power)]},
        {"status": "firing", "alerts": [alert("firing", **chain), alert("firing", alertname="Other", host="h")]},
        {"status": "firing", "alerts": [alert("firing", **power)]},          # paged again after a restart
        {"status": "resolved", "alerts": [alert("resolved", **chain)]},
    ])
    counts, other = s.count_pages()
    assert counts == {"power jump": {"firing": 2, "resolved": 0}, "deleted chain": {"firing": 1, "resolved": 1}}
    assert other == ["firing Other h"]
    res = SoakResult(kills=[], cold_start_s={}, pages=counts, lost_in_worker={}, collector_gaps={}, series=0,
                     samples=0, weight_samples=0, unsafe_weights=[], restarts=0)
    assert res.problems_ok() == {"power jump": False, "deleted chain": True}


def test_all_zero_and_oversized_weight_steps_are_flagged(tmp_path: Path) -> None:
    s = Soak(tmp_path, QUICK, echo=lambda _: None)
    s.doc = {"controllers": {"actuator": {"max_step": 0.5}}}
    s.weights = [(1.0, {"near": 128, "far": 128}), (2.0, {"near": 200, "far": 56}),   # step 0.28: fine
                 (3.0, {"near": 0, "far": 0}),                                          # all zero
                 (4.0, {"near": 256, "far": 1}), (5.0, {"near": 1, "far": 255})]        # step ~0.99
    bad = s.check_weights()
    assert len(bad) == 2 and "all zero" in bad[0] and "step 0.99" in bad[1]


def test_recovery_percentiles() -> None:
    kills = [Kill("a", 0, r) for r in (1.0, 2.0, 3.0, 10.0)] + [Kill("b", 0, None)]
    res = SoakResult(kills=kills, cold_start_s={}, pages={}, lost_in_worker={"s": 1}, collector_gaps={"t": 2},
                     series=2, samples=9, weight_samples=0, unsafe_weights=[], restarts=0)
    assert res.recovery() == [1.0, 2.0, 3.0, 10.0] and res.recovery("b") == []
    assert pct(res.recovery(), 50) in (2.0, 3.0) and pct(res.recovery(), 99) == 10.0
    assert res.lost == 3


def test_a_gap_counts_as_lost_rounds_unless_its_collector_was_killed() -> None:
    from bench.bench_soak import missing_rounds

    steady = list(range(1000, 1100, 2))
    assert missing_rounds(steady, [], 2.0) == 0
    holed = [t for t in steady if not 1040 <= t < 1060]          # 10 rounds gone (e.g. a torn spool)
    assert missing_rounds(holed, [], 2.0) == 10
    assert missing_rounds(holed, [(1041.0, 1055.0)], 2.0) == 0    # the collector itself was down then
    assert missing_rounds([t for t in steady if t != 1040], [], 2.0) == 0   # one late round is no loss
