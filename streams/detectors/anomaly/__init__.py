"""Anomaly: any configured numeric series -> a finding while it leaves its normal band.

``model.py`` the streaming detector (shared with ``opsloop detect replay|evaluate`` and the benches);
``handler.py`` the stream handler (one detector per series); ``settings.py`` ``streams.detectors.anomaly``
of opsloop.yaml (which series are watched).
"""

from opsloop.streams.detectors.anomaly.handler import AnomalyHandler
from opsloop.streams.detectors.anomaly.settings import AnomalySettings
from opsloop.streams.detectors.plugin import Detector


def _active(settings: AnomalySettings) -> bool:
    return settings.enabled and bool(settings.series)   # no series, nothing to watch


DETECTOR = Detector("anomaly", AnomalySettings, AnomalyHandler, _active)
