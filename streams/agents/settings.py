"""Typed settings of the detector agents: the ``streams.detectors`` section of opsloop.yaml.

One key per registered detector (``opsloop.streams.detectors.registry``), each validated by the
settings model in the detector's folder. Every key is optional; the defaults follow the source
documents. Example::

    streams:
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

from pydantic import Field, ValidationError, create_model

from opsloop.config import Settings
from opsloop.validation import describe_validation_error
from opsloop.streams.detectors.plugin import Strict
from opsloop.streams.detectors.registry import DETECTORS

SECTION = "detectors"

_fields: dict[str, Any] = {"refresh_s": (float, Field(default=300.0, gt=0))}
_fields.update({d.name: (d.settings, Field(default_factory=d.settings)) for d in DETECTORS})
# Built from the registry so that a new detector needs no line here.
DetectorsSettings = create_model("DetectorsSettings", __base__=Strict, __module__=__name__, **_fields)


def detectors_settings(settings: Settings) -> Any:
    """Validate ``streams.detectors`` (formerly ``controllers.detectors``); a ValueError names the field and value."""
    try:
        return DetectorsSettings.model_validate(settings.section(f"streams.{SECTION}"))
    except ValidationError as e:
        raise ValueError(describe_validation_error(e, prefix=f"streams.{SECTION}.")) from None
