"""Settings of the netperf detector: ``streams.detectors.netperf`` of opsloop.yaml."""

from __future__ import annotations

from pydantic import Field

from opsloop.streams.detectors.plugin import Strict


class NetperfSettings(Strict):
    enabled: bool = True
    drop_ratio: float = Field(default=0.2, gt=0, lt=1)
    baseline_runs: int = Field(default=5, ge=1)
    min_speedup: float = Field(default=1.5, gt=1)
    min_queue_ratio: int = Field(default=4, ge=2)
