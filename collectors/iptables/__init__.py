"""iptables state collector: are the VMs' Neutron security-group chains present and reachable?

Signal 4 of docs/design.md ("Temporary elevated reachability", see docs/sources.md): per VM port, whether its
security-group chains exist and are jumped to on the tap device's FORWARD path; per hypervisor,
a ruleset fingerprint and package versions so that drift between hypervisors shows.
"""

from __future__ import annotations

from opsloop.collect.types import Collector

from opsloop.collectors.iptables.collector import IptablesCollector
from opsloop.collectors.iptables.config import Config, Target

__all__ = ["Config", "Target", "build", "IptablesCollector"]


def build(config: Config) -> Collector:
    return IptablesCollector(config)
