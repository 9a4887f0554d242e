"""A setting changed between two runs applies to the keys the next run restores (netperf, keystone), as it does
for the anomaly detector (tests/streams/agents/test_handlers.py). Before, the detectors were rebuilt from the
knobs stored in their state: an operator who raised ``drop_ratio`` or ``p95_limit_ms`` to stop a false finding
saw it re-raised by every target set or host already watched, for as long as it reported."""

from __future__ import annotations

import orjson
import pytest

from opsloop.config import Settings
from opsloop.records import Metric, metric
from opsloop.streams.agents.base import DetectorHandler
from opsloop.streams.agents.settings import detectors_settings
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.keystone.settings import KeystoneSettings
from opsloop.streams.detectors.netperf.handler import NetperfHandler
from opsloop.streams.detectors.netperf.settings import NetperfSettings

T0 = 1_795_200_000.0


def _restarted(h: DetectorHandler, keys: list[str], fresh: DetectorHandler) -> DetectorHandler:
    """``fresh`` (a new worker, its own settings) restored from ``h``'s state as the changelog carries it."""
    fresh.restore({k: orjson.loads(orjson.dumps(h.state_of(k))) for k in keys})
    return fresh


def _result(gbps: float, ts: float) -> Metric:
    return metric("netperf_throughput", {"mean_gbps": gbps, "failed_targets": 0},
                  {"host": "bench-1", "target_set": "six-vms", "driver": "netperf", "test": "TCP_STREAM",
                   "queues": "8"}, ts)


def test_a_netperf_drop_ratio_raised_between_runs_applies_to_a_restored_target_set() -> None:
    h = NetperfHandler(NetperfSettings(drop_ratio=0.2, baseline_runs=5))
    for i in range(5):
        h.handle([_result(8.4, T0 + 3600 * i)], T0)
    h.handle([_result(6.3, T0 + 3600 * 5)], T0)   # 25 % down: a drop at 20 %
    assert [f.detector for f in h.open_findings()] == ["netperf.throughput_drop"]
    # the operator finds 25 % within this setup's noise: 40 % from now on
    h2 = _restarted(h, ["six-vms"], NetperfHandler(NetperfSettings(drop_ratio=0.4, baseline_runs=3), 300.0))
    det = h2.detectors["six-vms"]
    assert (det.drop_ratio, det.baseline_runs) == (0.4, 3)
    assert all(len(v) <= 3 for v in det.history.values()), "the baseline as long as configured"
    h2.handle([_result(6.3, T0 + 3600 * 6)], T0)
    assert [(e, f.detector) for e, f in h2.drain_outbox()] == [("cleared", "netperf.throughput_drop")]


def _frontend(t: float, p95_ms: float, heavy: float, host: str = "rgw-1") -> list[Metric]:
    return [metric("s3_frontend_requests", {"small_requests": 200.0, "small_p50_ms": p95_ms / 2,
                                            "small_p95_ms": p95_ms}, {"host": host}, t),
            metric("s3_frontend_credential", {"keystone_validations": heavy}, {"host": host, "access_key": "AK1"}, t),
            metric("s3_frontend_credential", {"keystone_validations": 100.0}, {"host": host, "access_key": "AK2"}, t)]


def test_keystone_limits_changed_between_runs_apply_to_a_restored_host() -> None:
    h = KeystoneHandler(KeystoneSettings())
    for i in range(12):
        h.handle(_frontend(T0 + 60 * i, 600.0, 100.0), T0)   # p95 600 ms (limit 500), AK1 half of all validations
    assert sorted(f.detector for f in h.open_findings()) == ["keystone.heavy_hitter", "keystone.heavy_hitter",
                                                             "keystone.small_request_p95"]
    h.drain_outbox()
    relaxed = KeystoneSettings(p95_limit_ms=800.0, heavy_share=0.6)
    h2 = _restarted(h, ["rgw-1"], KeystoneHandler(relaxed, 300.0))
    st = h2.hosts["rgw-1"]
    assert (st.p95.p95_limit_ms, st.heavy.share) == (800.0, 0.6)
    for i in range(12, 24):
        h2.handle(_frontend(T0 + 60 * i, 600.0, 100.0), T0)
    assert h2.open_findings() == []
    assert sorted(f.detector for e, f in h2.drain_outbox() if e == "cleared") == [
        "keystone.heavy_hitter", "keystone.heavy_hitter", "keystone.small_request_p95"]


def test_a_keystone_heavy_window_resized_between_runs_counts_afresh() -> None:
    h = KeystoneHandler(KeystoneSettings())
    for i in range(6):
        h.handle(_frontend(T0 + 60 * i, 10.0, 400.0), T0)
    h2 = _restarted(h, ["rgw-1"], KeystoneHandler(KeystoneSettings(heavy_window_s=600.0, heavy_pane_s=120.0), 300.0))
    window = h2.hosts["rgw-1"].heavy.window
    assert (window.window_s, window.pane_s, window.panes) == (600.0, 120.0, [])
    for i in range(6, 20):   # panes of the new size fill and roll: the heavy hitter is found again
        h2.handle(_frontend(T0 + 60 * i, 10.0, 400.0), T0)
    assert {f.where["credential"] for f in h2.open_findings() if f.detector == "keystone.heavy_hitter"} == {"AK1"}


def test_a_heavy_hitter_pane_longer_than_its_window_is_refused_at_load() -> None:
    """Before, it loaded, and every keystone sample raised in the handler (each one a handler failure)."""
    with pytest.raises(ValueError, match=r"streams\.detectors\.keystone: heavy_pane_s \(60\) must be at most "
                                         r"heavy_window_s \(30\)"):
        detectors_settings(Settings(streams={"detectors": {"keystone": {"heavy_window_s": 30, "heavy_pane_s": 60}}}))
    detectors_settings(Settings(streams={"detectors": {"keystone": {"heavy_window_s": 60, "heavy_pane_s": 60}}}))
