"""The anomaly agent over the one-alarm-per-event detector: the finding opens once and stays open
while the series is out of its band, and clears when it is back."""

from __future__ import annotations

from opsloop.records import metric
from opsloop.streams.detectors.anomaly.handler import AnomalyHandler
from opsloop.streams.detectors.anomaly.settings import AnomalySettings

T0 = 1_790_000_000.0


def _watts(h: AnomalyHandler, start: int, values: list[float]) -> list[str]:
    events = []
    for i, w in enumerate(values):
        h.handle([metric("ipmi_power", {"watts": w}, {"host": "bmc1"}, T0 + 5 * (start + i))], T0)
        events += [e for e, _ in h.drain_outbox()]
    return events


def test_power_jump_opens_one_finding_that_stays_open_until_power_goes_back() -> None:
    h = AnomalyHandler(AnomalySettings.model_validate({"series": [{"metric": "ipmi_power", "field": "watts"}]}))
    assert _watts(h, 0, [248.0] * 60) == []                 # a flat DCMI reading, warm
    h.handle([metric("ipmi_power", {"watts": 600.0}, {"host": "bmc1"}, T0 + 5 * 60)], T0)
    [(event, finding)] = h.drain_outbox()
    assert event == "opened" and finding.observed == 600.0 and finding.score >= 0.9
    assert "expected 248" in finding.explanation, finding.explanation
    assert _watts(h, 61, [600.0] * 40) == []                # still open, no second page, no clear
    series = h.series["ipmi_power.watts|host=bmc1"]
    assert series.book.is_open("anomaly.ipmi_power.watts", series.where)
    assert _watts(h, 101, [248.0] * 20) == ["cleared"]      # power back: resolved
