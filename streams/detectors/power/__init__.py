"""Power ``telemetry.ipmi`` -> energy, cost per usable TB-year, generation deviation, idle servers.

``detector.py`` the pure, state-serialisable logic; ``handler.py`` the stream handler (metrics in,
findings and gauges out); ``settings.py`` ``streams.detectors.power`` of opsloop.yaml.
"""

from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.detectors.power.settings import PowerSettings
from opsloop.streams.detectors.plugin import Detector

DETECTOR = Detector("power", PowerSettings, PowerHandler)
