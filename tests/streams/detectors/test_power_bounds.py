"""An implausible power reading (1e308 W is valid on the wire) is refused through the power handler's reject
path: counted, handed to the runtime to dead-letter, and kept out of the host's mean. Before, one such reading
kept the host's smoothed draw at 1e262 W for thousands of good readings (a false deviation finding), and as a
host's first reading made its yearly energy and cost inf."""

from __future__ import annotations

import math

import pytest

from opsloop.records import metric
from opsloop.streams.detectors.power.detector import MAX_HOST_WATTS, PowerDetector, ServerSpec, power_reading
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.detectors.power.settings import PowerSettings

T0 = 1_795_000_000.0


def _sample(host: str, watts: float, ts: float):
    return metric("ipmi_power", {"watts": watts}, {"host": host, "generation": "g3", "raw_capacity_tb": "100"}, ts)


def test_a_glitch_reading_is_refused_and_the_mean_stays_true() -> None:
    h = PowerHandler(PowerSettings())
    t = T0
    for _ in range(20):
        t += 10
        h.handle([_sample(f"h{j}", 150.0, t) for j in range(4)], t)
    t += 10
    h.handle([_sample("h0", 1e308, t)], t)
    assert h.rejected == 1
    (refused,) = h.drain_rejected()
    assert "1e+308" in refused.error and "plausible" in refused.error
    for _ in range(5):
        t += 10
        h.handle([_sample(f"h{j}", 150.0, t) for j in range(4)], t)
    assert h.detector.mean_watts("h0") == pytest.approx(150.0)
    assert not [f for f in h.open_findings() if f.detector == "power.generation_deviation"]


def test_an_implausible_first_reading_gives_no_infinite_cost() -> None:
    h = PowerHandler(PowerSettings())
    for i in range(3):
        h.handle([_sample("n1", 1e308, T0 + i)], T0 + i)
    assert h.rejected == 3 and h.detector.mean_watts("n1") is None
    assert all(math.isfinite(f.observed) for f in h.open_findings() if isinstance(f.observed, float))


@pytest.mark.parametrize("watts", [MAX_HOST_WATTS * 1.01, 1e308, -1.0])
def test_the_readers_refuse_a_draw_out_of_range_naming_it(watts: float) -> None:
    with pytest.raises(ValueError, match="watts"):
        power_reading(_sample("h", watts, T0))
    det = PowerDetector([ServerSpec("h", "g3", 96.0)])
    with pytest.raises(ValueError, match="watts"):
        det.update({"host": "h", "watts": watts, "timestamp": T0})
    assert det.mean_watts("h") is None


def test_the_largest_plausible_draw_is_read() -> None:
    assert power_reading(_sample("h", MAX_HOST_WATTS, T0)) == ("h", MAX_HOST_WATTS)
