"""Domain detectors on the source documents' figures (docs/sources.md): firewall, netperf, Keystone, power."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from opsloop.records import Finding, Severity
from opsloop.records import metric
from opsloop.streams.detectors.firewall.detector import (FINGERPRINT_DRIFT, PACKAGE_DRIFT, UNPROTECTED,
                                                         FirewallDetector, report_from_metrics)
from opsloop.streams.detectors.keystone.detector import (HEAVY, REGIME, SMALL_P95, HeavyHitterDetector,
                                                         LatencyRegimeDetector, SmallRequestP95Detector)
from opsloop.streams.detectors.netperf.detector import DROP, NO_SCALING, NetperfDetector
from opsloop.streams.detectors.power.detector import (PowerDetector, ServerSpec, cost_per_usable_tb_year,
                                                      protection_efficiency)
from opsloop.streams.detectors.sketches import LogHistogram, SpaceSaving

T0 = 1_700_000_000.0


def _roundtrip(det):  # noqa: ANN001, ANN202 - any detector class with to_dict/from_dict
    return type(det).from_dict(json.loads(json.dumps(det.to_dict(), allow_nan=False)))


def _report(hv: str, now: float, missing: set[str] = frozenset(), fp: str = "fp-a", neutron: str = "9.4.1") -> dict:
    return {"hypervisor": hv, "role": "compute", "timestamp": now, "ruleset_fingerprint": fp,
            "packages": {"neutron-openvswitch-agent": neutron, "iptables": "1.6.0"},
            "ports": [{"port": f"{hv}-tap{i}", "vm": f"vm-{hv}-{i}", "chain_present": f"{hv}-tap{i}" not in missing}
                      for i in range(3)]}


# ------------------------------------------------------------------------------------------ firewall
def test_unprotected_port_is_critical_at_once_and_cleared_when_fixed() -> None:
    det = FirewallDetector()
    found = det.update(_report("hv1", T0, missing={"hv1-tap1"}))
    crit = [f for f in found if f.detector == UNPROTECTED]
    assert len(crit) == 1 and crit[0].severity is Severity.CRITICAL and not crit[0].cleared
    assert crit[0].where == {"hypervisor": "hv1", "port": "hv1-tap1", "vm": "vm-hv1-1"}
    det = _roundtrip(det)                       # a restarted worker: still open, same first_seen
    again = [f for f in det.update(_report("hv1", T0 + 60, missing={"hv1-tap1"})) if f.detector == UNPROTECTED]
    assert again[0].first_seen == T0 and again[0].last_seen == T0 + 60 and again[0].id == crit[0].id
    fixed = [f for f in det.update(_report("hv1", T0 + 120)) if f.detector == UNPROTECTED]
    assert len(fixed) == 1 and fixed[0].cleared
    assert not [f for f in det.update(_report("hv1", T0 + 180)) if f.detector == UNPROTECTED]


def test_five_hypervisors_lose_their_chains() -> None:
    det = FirewallDetector()
    broken = {f"hv{i}" for i in (3, 7, 11, 19, 23)}
    for i in range(30):
        det.update(_report(f"hv{i}", T0))
    found: list[Finding] = []
    for i in range(30):
        hv = f"hv{i}"
        miss = {f"{hv}-tap{p}" for p in range(3)} if hv in broken else set()
        neutron = "9.0.0" if hv in broken else "9.4.1"          # the older Newton build
        found += det.update(_report(hv, T0 + 60, missing=miss, neutron=neutron))
    open_crit = {f.where["hypervisor"] for f in found if f.detector == UNPROTECTED and not f.cleared}
    assert open_crit == broken
    drift = {f.where["hypervisor"] for f in det.book.open_findings() if f.detector == PACKAGE_DRIFT}
    assert drift == broken
    assert all(f.severity is Severity.WARNING for f in det.book.open_findings() if f.detector == PACKAGE_DRIFT)


def test_fingerprint_drift_warns_and_clears() -> None:
    det = FirewallDetector()
    for i in range(4):
        det.update(_report(f"hv{i}", T0))
    found = det.update(_report("hv2", T0 + 60, fp="fp-b"))
    assert [f.where["hypervisor"] for f in found if f.detector == FINGERPRINT_DRIFT and not f.cleared] == ["hv2"]
    cleared = det.update(_report("hv2", T0 + 120))
    assert any(f.detector == FINGERPRINT_DRIFT and f.cleared for f in cleared)


def test_firewall_report_from_metrics_and_bad_report() -> None:
    ms = [metric("firewall_port", {"chain_present": False}, {"hypervisor": "hv9", "port": "tapX", "vm": "v"}, T0),
          metric("firewall_host", {"ruleset_fingerprint": "abc", "pkg_neutron": "9.4.1"},
                 {"hypervisor": "hv9", "role": "network"}, T0)]
    [rep] = report_from_metrics(ms)
    assert rep.ports == {"tapX": ("v", False)} and rep.role == "network" and rep.packages == {"neutron": "9.4.1"}
    assert FirewallDetector().update(rep)[0].severity is Severity.CRITICAL
    with pytest.raises(ValueError, match="chain_present"):
        FirewallDetector().update({"hypervisor": "x", "timestamp": T0, "ports": [{"port": "p"}]})


# ------------------------------------------------------------------------------------------- netperf
def _feed(det: NetperfDetector, label: str, table: dict[int, float]) -> list[Finding]:
    out: list[Finding] = []
    for q, g in table.items():
        out += det.update({"target_set": "six-vms", "label": label, "queues": q, "throughput_gbps_mean": g,
                           "timestamp": T0})
    return out


def test_published_queue_tables() -> None:
    det = NetperfDetector()
    old = _feed(det, "3.13-kernel", {1: 3.28, 2: 3.41, 4: 3.51, 8: 3.57})
    new = _feed(det, "4.4-kernel", {1: 3.23, 2: 6.00, 4: 8.02, 8: 8.42})
    flagged = [f for f in old if f.detector == NO_SCALING]
    assert flagged and flagged[-1].observed == pytest.approx(3.57 / 3.28, abs=1e-3) and not flagged[-1].cleared
    assert not [f for f in new if f.detector == NO_SCALING]


def test_throughput_drop_against_the_same_target_set_and_label() -> None:
    det = NetperfDetector()
    for g in (8.42, 8.40, 8.45):
        assert not det.update({"target_set": "a", "label": "k", "queues": 8, "throughput_gbps_mean": g, "timestamp": T0})
    # Another label's low figures are not compared with this baseline.
    assert not det.update({"target_set": "a", "label": "other", "queues": 8, "throughput_gbps_mean": 3.5, "timestamp": T0})
    det = _roundtrip(det)
    [drop] = det.update({"target_set": "a", "label": "k", "queues": 8, "throughput_gbps_mean": 3.57, "timestamp": T0 + 1})
    assert drop.detector == DROP and drop.expected == pytest.approx(8.42) and drop.observed == 3.57
    [back] = det.update({"target_set": "a", "label": "k", "queues": 8, "throughput_gbps_mean": 8.41, "timestamp": T0 + 2})
    assert back.cleared
    with pytest.raises(ValueError, match="throughput_gbps_mean"):
        det.update({"target_set": "a", "timestamp": T0})


def test_netperf_from_wire_metric() -> None:
    det = NetperfDetector(min_baseline_runs=1)
    m = metric("netperf", {"throughput_gbps_mean": 8.4}, {"target_set": "s", "label": "l", "queues": "8"}, T0)
    assert det.update(m) == []
    m2 = metric("netperf", {"throughput_gbps_mean": 3.5}, {"target_set": "s", "label": "l", "queues": "8"}, T0 + 1)
    assert det.update(m2)[0].detector == DROP


# ------------------------------------------------------------------------------------------ keystone
def test_latency_regime_10ms_to_600ms_and_back() -> None:
    rng = random.Random(1)
    det = LatencyRegimeDetector()
    opened = cleared = None
    for i in range(300):
        ms = (600.0 if 100 <= i < 200 else 9.0) * math.exp(rng.gauss(0, 0.25))
        for f in det.update(T0 + 10 * i, ms, {"instance": "ks1"}):
            if f.cleared:
                cleared = i
            elif opened is None:
                opened = i
        if i == 150:
            det = _roundtrip(det)
    assert opened is not None and 100 <= opened <= 103
    assert cleared is not None and 200 <= cleared <= 203
    with pytest.raises(ValueError, match="latency_ms"):
        det.update(T0, -1.0)


def test_single_slow_request_is_not_a_regime() -> None:
    det = LatencyRegimeDetector()
    found = []
    for i in range(100):
        found += det.update(T0 + i, 700.0 if i == 50 else 9.0)
    assert not found


def test_heavy_hitter_credentials_with_bounded_memory() -> None:
    rng = random.Random(2)
    det = HeavyHitterDetector(share=0.2, window_s=300, pane_s=60, capacity=16)
    raised: set[str] = set()
    for i in range(20_000):
        cred = "AKIA-HEAVY" if rng.random() < 0.4 else f"AKIA-{rng.randrange(10_000)}"
        for f in det.update(T0 + i * 0.05, cred, {"region": "zh"}):
            if f.detector == HEAVY and not f.cleared:
                raised.add(f.where["credential"])
        if i == 10_000:
            det = _roundtrip(det)
    assert raised == {"AKIA-HEAVY"}
    assert all(len(s.counts) <= 16 for _, s in det.window.panes)
    assert len(det.window.panes) <= 5


def test_small_request_p95_750_to_100ms() -> None:
    rng = random.Random(3)
    det = SmallRequestP95Detector(window_s=300, p95_limit_ms=500)
    states = []
    for i in range(6000):
        t = T0 - T0 % 300 + i * 0.5
        uncached = t < T0 + 1500
        small = rng.random() < 0.8
        ms = (rng.uniform(600, 760) if uncached else rng.uniform(5, 100)) if small else rng.uniform(3000, 9000)
        body = rng.randrange(0, 65536) if small else 10_000_000
        for f in det.update(t, body, rng.randrange(200, 2000), ms):
            states.append((f.cleared, f.observed))
    assert states[0][0] is False and 700 <= states[0][1] <= 780
    assert any(cleared for cleared, _ in states)
    assert det.series[-1][1] < 110


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=400), st.integers(1, 8))
def test_space_saving_guarantees(items: list[int], capacity: int) -> None:
    s = SpaceSaving(capacity)
    for x in items:
        s.offer(str(x))
    truth = {str(k): items.count(k) for k in set(items)}
    assert len(s.counts) <= capacity and s.total == len(items)
    for k, (count, err) in s.counts.items():
        assert count - err <= truth.get(k, 0) <= count
    for k, c in truth.items():
        if c > len(items) / capacity:
            assert k in s.counts


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.01, max_value=1e5), min_size=1, max_size=300))
def test_log_histogram_quantile_relative_error(values: list[float]) -> None:
    h = LogHistogram(1.02)
    for v in values:
        h.add(v)
    exact = sorted(values)[int(0.95 * (len(values) - 1))]
    assert h.quantile(0.95) == pytest.approx(exact, rel=0.025)


# --------------------------------------------------------------------------------------------- power
PUBLISHED_POWER = {"gen1": (248.0, 48.0, 29.10, 14.55), "gen2": (205.0, 48.0, 24.05, 12.03), "gen3": (155.0, 96.0, 9.09, 4.55)}


@pytest.mark.parametrize("protection,column", [("replica:3", 2), ("ec:2+1", 3)])
def test_published_power_table_comes_out_of_the_stream(protection: str, column: int) -> None:
    inv = [ServerSpec(g, g, raw, protection, 0.7) for g, (w, raw, *_r) in PUBLISHED_POWER.items()]
    det = PowerDetector(inv, eur_per_kwh=0.15)
    found: list[Finding] = []
    for i in range(5):
        for g, (w, *_r) in PUBLISHED_POWER.items():
            found += det.update(metric("ipmi_power", {"watts": w}, {"host": g, "source": "dcmi"}, T0 + 60 * i))
    costs = {f.where["host"]: f.observed for f in found if f.detector == "power.cost"}
    assert costs == {g: row[column] for g, row in PUBLISHED_POWER.items()}
    row = det.cost_row(inv[2], 155.0)
    assert row["kwh_per_year"] == pytest.approx(1357.8) and row["eur_per_year"] == pytest.approx(203.67)


def test_generation_deviation_and_idle_candidate() -> None:
    inv = [ServerSpec(f"g3-{i}", "gen3", 96.0) for i in range(4)] + [ServerSpec("g3-spare", "gen3", 96.0, in_service=False)]
    det = PowerDetector(inv)
    found: list[Finding] = []
    for i in range(5):
        for k in range(4):
            found += det.update({"host": f"g3-{k}", "watts": 200.0 if k == 3 else 155.0, "timestamp": T0 + i})
        found += det.update({"host": "g3-spare", "watts": 136.0, "timestamp": T0 + i})
    det = _roundtrip(det)
    open_ = {(f.detector, f.where["host"]) for f in det.book.open_findings()}
    assert ("power.generation_deviation", "g3-3") in open_
    assert not any(d == "power.generation_deviation" and h != "g3-3" for d, h in open_)
    assert ("power.idle_candidate", "g3-spare") in open_


def test_power_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="protection"):
        protection_efficiency("raid5")
    with pytest.raises(ValueError, match="fill_ratio"):
        ServerSpec("h", "g", 10.0, fill_ratio=1.5)
    with pytest.raises(ValueError, match="watts"):
        PowerDetector([]).update({"host": "h", "watts": "lots"})
    assert cost_per_usable_tb_year(155, 96, "ec:2+1", 0.7, 0.15) == pytest.approx(9.09 / 2, abs=0.01)
