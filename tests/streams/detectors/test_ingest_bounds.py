"""What a detector takes in is what its restore takes back: a sample or a setting beyond a stored state's bounds is
refused where it comes in (the sample counted and handed to the runtime to dead-letter, the setting at load with
an error naming it), the key's good samples go on.

Before: a netperf ``queues`` tag of 25 digits, an ``ipmi_power`` ``raw_capacity_tb`` tag of 2e6 (or ``inf``) and a
configured ``raw_tb`` of 2e6 were accepted and stored, and every restore refused the key's state
(``state_restore_failed``): the target set's baseline, the host's mean draw and its open findings started afresh
at each restart, for as long as the tag came. A ``p95_window_s`` or ``heavy_window_s`` typo (86400000) loaded:
a window that never closes, so its finding was never raised nor cleared, and nothing said so."""

from __future__ import annotations

import orjson
import pytest

from opsloop.config import Settings
from opsloop.records import Metric, metric
from opsloop.streams.agents.base import DetectorHandler
from opsloop.streams.agents.settings import detectors_settings
from opsloop.streams.detectors.netperf.handler import NetperfHandler
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.detectors.power.settings import PowerSettings

T0 = 1_795_400_000.0


def _stored(h: DetectorHandler, key: str) -> dict:
    """``key``'s state as the changelog carries it (JSON)."""
    state = h.state_of(key)
    assert state is not None
    return orjson.loads(orjson.dumps(state))


def _netperf(queues: str, gbps: float, ts: float) -> Metric:
    return metric("netperf_throughput", {"mean_gbps": gbps, "failed_targets": 0},
                  {"host": "bench-1", "target_set": "six-vms", "driver": "netperf", "test": "TCP_STREAM",
                   "queues": queues}, ts)


def test_a_queue_count_no_restore_takes_is_refused_at_ingest_and_the_set_restores() -> None:
    h = NetperfHandler()
    h.handle([_netperf("1", 3.2, T0), _netperf("8", 8.4, T0)], T0)
    h.handle([_netperf("9" * 25, 8.4, T0 + 60)], T0 + 60)
    assert h.rejected == 1
    (refused,) = h.drain_rejected()
    assert "queues" in refused.error and "9" * 25 in refused.error
    h.handle([_netperf("8", 8.3, T0 + 120)], T0 + 120)   # the set's good results go on
    state = _stored(h, "six-vms")
    NetperfHandler().restore_key("six-vms", state)   # raised StateError (by_queues key) on the old code
    fresh = NetperfHandler()
    fresh.restore({"six-vms": state})
    assert sorted(fresh.detectors["six-vms"].by_queues["six-vms|driver=netperf,test=TCP_STREAM"]) == ["1", "8"]


def test_the_longest_queue_count_a_state_holds_is_taken() -> None:
    h = NetperfHandler()
    h.handle([_netperf("9" * 20, 8.4, T0)], T0)
    assert h.rejected == 0
    NetperfHandler().restore_key("six-vms", _stored(h, "six-vms"))


def _power(host: str, raw_tb: str, ts: float, watts: float = 150.0) -> Metric:
    return metric("ipmi_power", {"watts": watts}, {"host": host, "generation": "gen3", "raw_capacity_tb": raw_tb}, ts)


@pytest.mark.parametrize("raw_tb", ["2e6", "1e400", "inf"])
def test_a_raw_capacity_no_restore_takes_is_refused_at_ingest_and_the_host_restores(raw_tb: str) -> None:
    h = PowerHandler(PowerSettings())
    for i in range(3):
        h.handle([_power("s1", "96", T0 + 60 * i)], T0 + 60 * i)
    assert [f.detector for f in h.open_findings()] == ["power.cost"]
    h.handle([_power("s1", raw_tb, T0 + 200, watts=900.0)], T0 + 200)
    assert h.rejected == 1
    (refused,) = h.drain_rejected()
    assert "raw_capacity_tb" in refused.error and raw_tb in refused.error
    assert h.detector.inventory["s1"].raw_tb == 96.0 and h.detector.mean_watts("s1") == pytest.approx(150.0)
    h.handle([_power("s1", "96", T0 + 240)], T0 + 240)   # the next good reading is read
    assert h.detector.sums["s1"][1] == 4
    state = _stored(h, "s1")
    PowerHandler(PowerSettings()).restore_key("s1", state)   # raised StateError (spec.raw_tb) on the old code


def test_a_first_reading_with_a_raw_capacity_no_restore_takes_leaves_no_state() -> None:
    h = PowerHandler(PowerSettings())
    h.handle([_power("s2", "2e6", T0)], T0)
    assert h.rejected == 1 and h.state_of("s2") is None


@pytest.mark.parametrize("section, doc, field", [
    ("keystone", {"p95_window_s": 86_400_000}, "keystone.p95_window_s"),
    ("keystone", {"heavy_window_s": 86_400_000, "heavy_pane_s": 60}, "keystone.heavy_window_s"),
    ("power", {"hosts": {"s1": {"raw_tb": 2e6}}}, "power.hosts.s1.raw_tb"),
])
def test_a_setting_beyond_what_the_detector_keeps_is_refused_at_load_naming_it(section: str, doc: dict,
                                                                                field: str) -> None:
    with pytest.raises(ValueError, match=rf"streams\.detectors\.{field}: Input should be less than or equal to"):
        detectors_settings(Settings(streams={"detectors": {section: doc}}))


def test_a_day_long_window_and_the_largest_raw_capacity_load() -> None:
    detectors_settings(Settings(streams={"detectors": {
        "keystone": {"p95_window_s": 86_400, "heavy_window_s": 86_400, "heavy_pane_s": 3600},
        "power": {"hosts": {"s1": {"raw_tb": 1e6}}}}}))
