"""Typed settings of the detector agents: the ``controllers.detectors`` section of opsloop.yaml.

Every key is optional; the defaults follow the seeds. Example::

    controllers:
      detectors:
        refresh_s: 300                 # re-publish a still-open finding after this much event time
        firewall: {roles: {hv-zh-07: compute}, min_role_size: 3}
        power:
          eur_per_kwh: 0.15
          defaults: {protection: "replica:3", fill_ratio: 0.7}
          hosts: {stor-g3-17: {generation: gen3, raw_tb: 96}}
        netperf: {drop_ratio: 0.2}
        keystone: {p95_limit_ms: 500, heavy_share: 0.2}
        anomaly:
          series:
            - {metric: ipmi_power, field: watts}
            - {metric: keystone_probe, field: p50_ms, tags: {probe: token_validate}}
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from opsloop.config import Settings
from opsloop.wire import WireError, describe_validation_error, topic_for
from opsloop.streams.detectors.anomaly import DetectorConfig
from opsloop.streams.detectors.power import protection_efficiency

SECTION = "detectors"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FirewallSettings(_Strict):
    enabled: bool = True
    roles: dict[str, str] = Field(default_factory=dict, description="hypervisor -> role (else the role tag)")
    min_role_size: int = Field(default=3, ge=2)


class PowerHost(_Strict):
    generation: str | None = None
    raw_tb: float | None = Field(default=None, gt=0)
    protection: str | None = None
    fill_ratio: float | None = Field(default=None, gt=0, le=1)
    in_service: bool | None = None

    @field_validator("protection")
    @classmethod
    def _protection(cls, v: str | None) -> str | None:
        if v is not None:
            protection_efficiency(v)
        return v


class PowerDefaults(_Strict):
    protection: str = "replica:3"
    fill_ratio: float = Field(default=0.7, gt=0, le=1)

    @field_validator("protection")
    @classmethod
    def _protection(cls, v: str) -> str:
        protection_efficiency(v)
        return v


class PowerSettings(_Strict):
    enabled: bool = True
    eur_per_kwh: float = Field(default=0.15, ge=0)
    deviation_ratio: float = Field(default=0.15, gt=0)
    min_generation_size: int = Field(default=3, ge=2)
    min_samples: int = Field(default=3, ge=1)
    defaults: PowerDefaults = Field(default_factory=PowerDefaults)
    hosts: dict[str, PowerHost] = Field(default_factory=dict)


class NetperfSettings(_Strict):
    enabled: bool = True
    drop_ratio: float = Field(default=0.2, gt=0, lt=1)
    baseline_runs: int = Field(default=5, ge=1)
    min_speedup: float = Field(default=1.5, gt=1)
    min_queue_ratio: int = Field(default=4, ge=2)


class KeystoneSettings(_Strict):
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


class SeriesSpec(_Strict):
    metric: str = Field(min_length=1)
    field: str = Field(min_length=1)
    tags: dict[str, str] = Field(default_factory=dict, description="only samples carrying these tag values")

    @field_validator("metric")
    @classmethod
    def _routable(cls, v: str) -> str:
        try:
            topic_for(v, {})
        except WireError as e:
            raise ValueError(str(e)) from None
        return v


DEFAULT_SERIES = [
    SeriesSpec(metric="ipmi_power", field="watts"),
    SeriesSpec(metric="keystone_probe", field="p50_ms"),
    SeriesSpec(metric="s3_frontend_requests", field="small_p95_ms"),
    SeriesSpec(metric="uwsgi_server", field="listen_queue"),
]


class AnomalySettings(_Strict):
    enabled: bool = True
    series: list[SeriesSpec] = Field(default_factory=lambda: list(DEFAULT_SERIES))
    open_score: float = Field(default=0.9, gt=0, le=1, description="score that opens a finding")
    clear_after: int = Field(default=3, ge=1, description="points below clear_score that clear it")
    clear_score: float = Field(default=0.3, ge=0, lt=1)
    max_series: int = Field(default=5000, ge=1, description="bound on tracked series (new ones are ignored)")
    detector: dict[str, float | int] = Field(default_factory=dict, description="DetectorConfig overrides")

    @field_validator("detector")
    @classmethod
    def _known(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            DetectorConfig(**v)
        except TypeError as e:
            raise ValueError(f"unknown detector setting: {e}") from None
        return v


class DetectorsSettings(_Strict):
    refresh_s: float = Field(default=300.0, gt=0)
    firewall: FirewallSettings = Field(default_factory=FirewallSettings)
    power: PowerSettings = Field(default_factory=PowerSettings)
    netperf: NetperfSettings = Field(default_factory=NetperfSettings)
    keystone: KeystoneSettings = Field(default_factory=KeystoneSettings)
    anomaly: AnomalySettings = Field(default_factory=AnomalySettings)


def detectors_settings(settings: Settings) -> DetectorsSettings:
    """Validate ``streams.detectors`` (formerly ``controllers.detectors``); a ValueError names the field and value."""
    try:
        return DetectorsSettings.model_validate(settings.section(f"streams.{SECTION}"))
    except ValidationError as e:
        raise ValueError(describe_validation_error(e, prefix=f"streams.{SECTION}.")) from None
