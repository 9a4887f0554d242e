"""Netperf: ``telemetry.netperf`` -> throughput drops against the baseline, queues that stop paying off.

``detector.py`` the pure, state-serialisable logic; ``handler.py`` the stream handler (metrics in,
findings and gauges out); ``settings.py`` ``streams.detectors.netperf`` of opsloop.yaml.
"""

from opsloop.streams.detectors.netperf.handler import NetperfHandler
from opsloop.streams.detectors.netperf.settings import NetperfSettings
from opsloop.streams.detectors.plugin import Detector

DETECTOR = Detector("netperf", NetperfSettings, NetperfHandler)
