"""Configuration of the iptables state collector (the ``collectors.iptables`` section)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

# NoBoolNumbers: YAML reads an unquoted yes/no/on/off as a boolean, which pydantic took as the number 1 or 0
from opsloop.validation import NoBoolNumbers

_ARGV = list[str]


class Target(NoBoolNumbers):
    """One hypervisor. Normally the collector runs on each hypervisor with one target (itself);
    ``netns`` runs the tools inside a network namespace (how tests model several hypervisors)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    host: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9_.:-]+$")
    netns: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    ports_file: Path | None = None
    ports_command: _ARGV | None = Field(default=None, min_length=1)
    versions_command: _ARGV | None = Field(default=None, min_length=1)


class Config(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    backend: Literal["auto", "legacy", "nft"] = "auto"
    # Neutron programs every port's security group in iptables and ip6tables alike; a port is protected
    # only when it is in each family read here. Drop ipv6 only on hypervisors with IPv6 disabled.
    families: list[Literal["ipv4", "ipv6"]] = Field(default_factory=lambda: ["ipv4", "ipv6"], min_length=1)
    chain_prefix: str = Field(default="neutron-openvswi", min_length=1, max_length=24,
                              pattern=r"^[A-Za-z0-9_-]+$")
    timeout_s: float = Field(default=10.0, gt=0, le=300)
    max_concurrency: int = Field(default=4, ge=1, le=64)
    # Wrapper that grants privilege when the collector itself runs unprivileged, e.g. ["sudo", "-n"].
    command_prefix: _ARGV = Field(default_factory=list)
    packages: list[str] = Field(default_factory=lambda: [
        "iptables", "neutron-openvswitch-agent", "neutron-linuxbridge-agent", "python3-neutron"],
        max_length=32)
    # Defaults for targets that do not set their own.
    ports_file: Path | None = None
    ports_command: _ARGV | None = Field(default=None, min_length=1)
    versions_command: _ARGV | None = Field(default=None, min_length=1)
    targets: list[Target] = Field(default_factory=list, max_length=256)

    @model_validator(mode="after")
    def _complete_targets(self) -> "Config":
        if not self.targets:
            self.targets = [Target(host=socket.gethostname().split(".")[0] or "localhost")]
        hosts = [t.host for t in self.targets]
        dup = {h for h in hosts if hosts.count(h) > 1}
        if dup:
            raise ValueError(f"targets: host {sorted(dup)[0]!r} appears more than once")
        for i, t in enumerate(self.targets):
            if t.ports_file is None and t.ports_command is None:
                t.ports_file, t.ports_command = self.ports_file, self.ports_command
            if t.ports_file is not None and t.ports_command is not None:
                raise ValueError(f"targets.{i} ({t.host}): set ports_file or ports_command, not both")
            if t.ports_file is None and t.ports_command is None:
                raise ValueError(f"targets.{i} ({t.host}): no ports_file or ports_command: the collector "
                                 "needs the list of VM ports that must be protected")
            if t.versions_command is None:
                t.versions_command = self.versions_command
        return self
