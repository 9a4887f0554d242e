"""Settings of the Keystone detectors: ``streams.detectors.keystone`` of opsloop.yaml."""

from __future__ import annotations

from pydantic import Field, model_validator

from opsloop.streams.detectors.plugin import Strict
from opsloop.streams.detectors.sketches import MAX_PANES

# The longest window a setting may ask for: a day. Longer is a typo (86400000): a window that never closes in
# practice, so its detector never evaluates and never clears, and no error said so.
MAX_WINDOW_S = 86_400.0


class KeystoneSettings(Strict):
    enabled: bool = True
    regime_ratio: float = Field(default=3.0, gt=1)
    p95_limit_ms: float = Field(default=500.0, gt=0)
    p95_window_s: float = Field(default=300.0, gt=0, le=MAX_WINDOW_S)
    p95_min_requests: int = Field(default=20, ge=1)
    heavy_share: float = Field(default=0.2, gt=0, le=1)
    heavy_min_total: int = Field(default=100, ge=1)
    heavy_window_s: float = Field(default=300.0, gt=0, le=MAX_WINDOW_S)
    heavy_pane_s: float = Field(default=60.0, gt=0)
    regime_min_count: int = Field(default=3, ge=1, description="requests behind a round's p50 to use it")

    @model_validator(mode="after")
    def _panes(self) -> "KeystoneSettings":
        # refused at load: before, such a window loaded and every keystone sample raised in the handler
        if not self.heavy_pane_s <= self.heavy_window_s <= self.heavy_pane_s * MAX_PANES:
            raise ValueError(f"heavy_pane_s ({self.heavy_pane_s:g}) must be at most heavy_window_s "
                             f"({self.heavy_window_s:g}), and the window at most {MAX_PANES} panes")
        return self
