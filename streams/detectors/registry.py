"""Every stream detector, one line each: adding one is its folder plus a line here.

The order is the order of ``streams.detectors`` in ``opsloop config defaults``; the handlers keep
their state under their own name, so it does not matter to the agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opsloop.streams.detectors import anomaly, firewall, keystone, netperf, power
from opsloop.streams.detectors.plugin import Detector

if TYPE_CHECKING:
    from opsloop.streams.agents.base import DetectorHandler

DETECTORS: tuple[Detector, ...] = (
    firewall.DETECTOR,
    power.DETECTOR,
    netperf.DETECTOR,
    keystone.DETECTOR,
    anomaly.DETECTOR,
)


def detector_handlers(conf: Any) -> list[DetectorHandler]:
    """The enabled handlers of a ``DetectorsSettings``, fresh (no Kafka needed: what unit tests and
    benchmarks use)."""
    out: list[DetectorHandler] = []
    for d in DETECTORS:
        settings = getattr(conf, d.name)
        if d.active(settings):
            out.append(d.handler(settings, conf.refresh_s))
    return out
