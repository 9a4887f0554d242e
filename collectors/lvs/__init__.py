"""LVS request-rate collector: per virtual service and real server, connections, packets and bytes
as counters and per-second rates, weights and scheduler (signal 5 of docs/design.md).

Metric names and tags follow Telegraf's ``inputs.ipvs`` (``ipvs_virtual_server``,
``ipvs_real_server``) so that both feed the same streams.
"""

from __future__ import annotations

from opsloop.collect.types import Collector

from opsloop.collectors.lvs.collector import LvsCollector
from opsloop.collectors.lvs.config import Config

__all__ = ["Config", "build", "LvsCollector"]


def build(config: Config) -> Collector:
    return LvsCollector(config)
