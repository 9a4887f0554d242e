"""Every stream handler given any *valid* sample of the names it reads (tags and field values of any shape
the wire format accepts: huge, negative, zero, strings where numbers are expected, bools) never raises: a
handler that raised lost the whole batch of every good sample with it (the runtime counts the error and the
batch is gone for that handler). A sample it cannot use is counted as rejected, the others are used."""

from __future__ import annotations

import time
from typing import Any, Callable

from hypothesis import HealthCheck, given, settings, strategies as st

from opsloop.records import Metric
from opsloop.streams.detectors.anomaly.handler import AnomalyHandler
from opsloop.streams.detectors.anomaly.settings import AnomalySettings
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.netperf.handler import NetperfHandler
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.lb.rates import LbRates

NOW = time.time()
TAG_KEYS = ["host", "server", "hypervisor", "role", "port_id", "port", "vm", "device", "package", "probe",
            "endpoint", "method", "access_key", "target_set", "label", "queues", "unit", "generation",
            "raw_capacity_tb", "proxy", "sv", "type", "sensor", "name", "protection"]
FIELD_KEYS = ["watts", "value", "count", "p50_ms", "p95_ms", "max_ms", "keystone_validations", "small_requests",
              "small_p50_ms", "small_p95_ms", "throughput_gbps", "throughput_gbps_mean", "queues", "protected",
              "chain_present", "version", "fingerprint", "hrsp_2xx", "stot", "weight", "status", "rules", "ports"]
TAG_VALUES = st.one_of(st.sampled_from(["", "0", "1", "-1", "a", "UP", "DOWN", "server", "backend", "frontend",
                                        "Watts", "W", "3", "1e400", "nan", "9" * 30, "POST", "/v3/auth/tokens"]),
                       st.text(max_size=20))
FIELD_VALUES = st.one_of(st.integers(min_value=-(2 ** 63), max_value=2 ** 64 - 1),
                         st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                         st.sampled_from(["", "UP", "DOWN 1/2", "abc", "1.5", "-3"]), st.text(max_size=10))

HANDLERS: dict[str, Callable[[], Any]] = {
    "power": PowerHandler, "firewall": FirewallHandler, "keystone": KeystoneHandler, "netperf": NetperfHandler,
    "lb-rates": LbRates,
    "anomaly": lambda: AnomalyHandler(AnomalySettings.model_validate(
        {"series": [{"metric": "ipmi_power", "field": "watts"}, {"metric": "haproxy", "field": "stot"}],
         "detector": {"warmup_points": 3}})),
}


def _names(h: Any) -> list[str]:
    return sorted(h.names)


@st.composite
def samples(draw: st.DrawFn, names: list[str]) -> list[Metric]:
    out = []
    for _ in range(draw(st.integers(1, 8))):
        tags = draw(st.dictionaries(st.sampled_from(TAG_KEYS), TAG_VALUES, max_size=6))
        fields = draw(st.dictionaries(st.sampled_from(FIELD_KEYS), FIELD_VALUES, min_size=1, max_size=6))
        ts = NOW - draw(st.floats(min_value=0, max_value=3600))
        out.append(Metric(name=draw(st.sampled_from(names)), tags=tags, fields=fields, timestamp=ts))
    return out


def _fuzz(kind: str) -> None:
    make = HANDLERS[kind]
    names = _names(make())

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(batches=st.lists(samples(names), min_size=1, max_size=4))
    def run(batches: list[list[Metric]]) -> None:
        h = make()
        for i, batch in enumerate(batches):
            h.handle(batch, NOW + i)

    run()


def test_power_handler_fuzz() -> None:
    _fuzz("power")


def test_firewall_handler_fuzz() -> None:
    _fuzz("firewall")


def test_keystone_handler_fuzz() -> None:
    _fuzz("keystone")


def test_netperf_handler_fuzz() -> None:
    _fuzz("netperf")


def test_lb_rates_handler_fuzz() -> None:
    _fuzz("lb-rates")


def test_anomaly_handler_fuzz() -> None:
    _fuzz("anomaly")


def test_the_anomaly_handler_rejects_a_value_its_detector_refuses_and_scores_the_series_on() -> None:
    """1e200 watts is counted as rejected (its detector refuses it), and the series' next good
    sample is scored. Before, the detector's sums went to inf and NaN on it."""
    h = HANDLERS["anomaly"]()

    def sample(value: Any, i: int) -> Metric:
        return Metric(name="ipmi_power", tags={"host": "a"}, fields={"watts": value},
                      timestamp=NOW - 100 + i)

    h.handle([sample(150.0 + i % 3, i) for i in range(10)], NOW)
    h.handle([sample(1e200, 10), sample(151.0, 12)], NOW)
    assert h.rejected == 1
    (series,) = h.series.values()
    assert series.last_ts == NOW - 100 + 12
