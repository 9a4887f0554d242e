"""Settings of the firewall detector: ``streams.detectors.firewall`` of opsloop.yaml."""

from __future__ import annotations

from pydantic import Field

from opsloop.streams.detectors.plugin import Strict, WhereValue


class FirewallSettings(Strict):
    enabled: bool = True
    roles: dict[WhereValue, WhereValue] = Field(default_factory=dict,
                                                description="hypervisor -> role (else the role tag)")
    min_role_size: int = Field(default=3, ge=2)
