"""Settings of the generic anomaly detector: ``streams.detectors.anomaly`` of opsloop.yaml (the series)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from pydantic import Field, field_validator

from opsloop.records.finding import MAX_WHERE_VALUE
from opsloop.records.metric import MAX_NAME_LEN
from opsloop.topics import topic_for
from opsloop.validation import NumberNotBool, WireError
from opsloop.streams.detectors.anomaly.model import DetectorConfig, checked_config
from opsloop.streams.detectors.plugin import Strict


class SeriesSpec(Strict):
    # both are values of the series' findings' `where` (opsloop/records/finding.py): a field beyond its bound made
    # every finding of the series impossible to build; a metric beyond a sample's name bound matched no sample
    metric: str = Field(min_length=1, max_length=MAX_NAME_LEN)
    field: str = Field(min_length=1, max_length=MAX_WHERE_VALUE)
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


class AnomalySettings(Strict):
    enabled: bool = True
    series: list[SeriesSpec] = Field(default_factory=lambda: list(DEFAULT_SERIES))
    open_score: float = Field(default=0.9, gt=0, le=1, description="score that opens a finding")
    clear_after: int = Field(default=3, ge=1, description="points below clear_score that clear it")
    clear_score: float = Field(default=0.3, ge=0, lt=1)
    max_series: int = Field(default=5000, ge=1, description="bound on tracked series (new ones are ignored)")
    # NumberNotBool: Strict does not look into a mapping (`detector: {warmup_points: yes}` was a warm-up of 1)
    detector: dict[str, NumberNotBool] = Field(default_factory=dict, description="DetectorConfig overrides")

    @field_validator("detector")
    @classmethod
    def _known(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - {f.name for f in fields(DetectorConfig)})
        if unknown:
            raise ValueError(f"unknown detector setting(s): {', '.join(unknown)}")
        # the ranges a stored state is checked against: a value outside them (z_width 0, flat_p 1, mean_rate 0)
        # divided by zero or took log(0) at every point, so every sample of every series raised
        problems = []
        for name, value in v.items():
            try:
                checked_config({name: value}, "detector")
            except ValueError as e:
                problems.append(str(e))
        if problems:
            raise ValueError("; ".join(problems))
        return v
