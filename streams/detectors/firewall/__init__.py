"""Firewall ``telemetry.iptables`` -> unprotected VM ports and drift between hypervisors.

``detector.py`` the pure, state-serialisable logic; ``handler.py`` the stream handler (metrics in,
findings and gauges out); ``settings.py`` ``streams.detectors.firewall`` of opsloop.yaml.
"""

from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.firewall.settings import FirewallSettings
from opsloop.streams.detectors.plugin import Detector

DETECTOR = Detector("firewall", FirewallSettings, FirewallHandler)
