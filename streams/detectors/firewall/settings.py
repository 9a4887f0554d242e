"""Settings of the firewall detector: ``streams.detectors.firewall`` of opsloop.yaml."""

from __future__ import annotations

from pydantic import Field

# WhereValue: a name its findings carry in ``where`` (a host, a generation, a role), refused at load beyond the
# record's bound (every finding naming it failed to build)
from opsloop.records.finding import WhereValue
from opsloop.streams.detectors.plugin import Strict


class FirewallSettings(Strict):
    enabled: bool = True
    roles: dict[WhereValue, WhereValue] = Field(default_factory=dict,
                                                description="hypervisor -> role (else the role tag)")
    min_role_size: int = Field(default=3, ge=2)
