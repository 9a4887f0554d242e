"""IPMI power collector: server power from each BMC (DCMI power reading, SDR Watts sensors otherwise).

See README.md in this folder. ``build(Config(...)).collect()`` reads every BMC of the inventory once.
"""

from __future__ import annotations

from opsloop.collectors.ipmi.collector import IpmiCollector
from opsloop.collectors.ipmi.config import Config, InventoryError, resolve_hosts

__all__ = ["Config", "IpmiCollector", "InventoryError", "build"]


def build(config: Config) -> IpmiCollector:
    """Resolve the inventory (raises InventoryError naming file, host and field) and build the collector."""
    return IpmiCollector(config, resolve_hosts(config))
