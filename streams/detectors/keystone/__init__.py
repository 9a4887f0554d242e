"""Keystone ``telemetry.keystone`` -> latency regime, heavy-hitter credentials, p95 of small requests.

``detector.py`` the pure, state-serialisable logic; ``handler.py`` the stream handler (metrics in,
findings and gauges out); ``settings.py`` ``streams.detectors.keystone`` of opsloop.yaml.
"""

from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.keystone.settings import KeystoneSettings
from opsloop.streams.detectors.plugin import Detector

DETECTOR = Detector("keystone", KeystoneSettings, KeystoneHandler)
