"""netperf throughput collector: the source documents' measurement (N parallel TCP_STREAM streams to a target set,
summed per run, repeated R times; mean/min/max/stddev in Gb/s), with ``netperf`` or ``iperf3 -J``.

See README.md in this folder. ``build(Config(...)).collect()`` measures every due target set once.
"""

from __future__ import annotations

from opsloop.collectors.netperf.collector import NetperfCollector
from opsloop.collectors.netperf.config import Config, TargetSet

__all__ = ["Config", "NetperfCollector", "TargetSet", "build"]


def build(config: Config) -> NetperfCollector:
    return NetperfCollector(config)
