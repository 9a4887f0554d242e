"""Settings of the Keystone detectors: ``streams.detectors.keystone`` of opsloop.yaml."""

from __future__ import annotations

from pydantic import Field

from opsloop.streams.detectors.plugin import Strict


class KeystoneSettings(Strict):
    enabled: bool = True
    regime_ratio: float = Field(default=3.0, gt=1)
    p95_limit_ms: float = Field(default=500.0, gt=0)
    p95_window_s: float = Field(default=300.0, gt=0)
    p95_min_requests: int = Field(default=20, ge=1)
    heavy_share: float = Field(default=0.2, gt=0, le=1)
    heavy_min_total: int = Field(default=100, ge=1)
    heavy_window_s: float = Field(default=300.0, gt=0)
    heavy_pane_s: float = Field(default=60.0, gt=0)
    regime_min_count: int = Field(default=3, ge=1, description="requests behind a round's p50 to use it")
