"""Settings of the power detector: ``streams.detectors.power`` of opsloop.yaml (prices, inventory)."""

from __future__ import annotations

from pydantic import Field, field_validator

# WhereValue: a name its findings carry in ``where`` (a host, a generation, a role), refused at load beyond the
# record's bound (every finding naming it failed to build)
from opsloop.records.finding import WhereValue
from opsloop.streams.detectors.plugin import Strict
from opsloop.streams.detectors.power.detector import MAX_RAW_TB, protection_efficiency


class PowerHost(Strict):
    generation: WhereValue | None = None
    raw_tb: float | None = Field(default=None, gt=0, le=MAX_RAW_TB)   # what a restore takes back
    protection: str | None = None
    fill_ratio: float | None = Field(default=None, gt=0, le=1)
    in_service: bool | None = None

    @field_validator("protection")
    @classmethod
    def _protection(cls, v: str | None) -> str | None:
        if v is not None:
            protection_efficiency(v)
        return v


class PowerDefaults(Strict):
    protection: str = "replica:3"
    fill_ratio: float = Field(default=0.7, gt=0, le=1)

    @field_validator("protection")
    @classmethod
    def _protection(cls, v: str) -> str:
        protection_efficiency(v)
        return v


class PowerSettings(Strict):
    enabled: bool = True
    eur_per_kwh: float = Field(default=0.15, ge=0)
    deviation_ratio: float = Field(default=0.15, gt=0)
    min_generation_size: int = Field(default=3, ge=2)
    min_samples: int = Field(default=3, ge=1)
    defaults: PowerDefaults = Field(default_factory=PowerDefaults)
    hosts: dict[WhereValue, PowerHost] = Field(default_factory=dict)
