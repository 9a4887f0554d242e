"""The collector's settings and the BMC inventory (hosts, how to reach their BMC, metadata).

The inventory can live in its own YAML file (``inventory: /etc/opsloop/bmcs.yaml``) or inline
under ``hosts:``; both have the same shape, and ``defaults:`` fill what a host leaves out.
Credentials are *references* (a file path or an environment variable name), never the secret.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from opsloop.validation import NoBoolNumbers, YamlFileError, describe_validation_error, read_yaml

_HOSTNAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Source = Literal["auto", "dcmi", "sdr"]
Privilege = Literal["CALLBACK", "USER", "OPERATOR", "ADMINISTRATOR"]


class InventoryError(ValueError):
    """The inventory file is missing or invalid; the message names the file, host and field."""


class _Strict(NoBoolNumbers):   # `cipher_suite: yes` was suite 1
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Metadata(_Strict):
    """What the power stream needs to turn watts into cost per usable TB ("(Ceph) storage (server) power usage")."""

    generation: str | None = Field(default=None, max_length=40)
    raw_capacity_tb: float | None = Field(default=None, ge=0)
    disks: int | None = Field(default=None, ge=0, le=10_000)
    role: str | None = Field(default=None, max_length=40)


class Access(_Strict):
    """How to log in to a BMC. Every field may come from the inventory's ``defaults``."""

    username: str | None = Field(default=None, min_length=1, max_length=16)  # IPMI limit: 16 bytes
    password_file: Path | None = None
    password_env: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    cipher_suite: int | None = Field(default=None, ge=0, le=17)
    source: Source | None = None

    @field_validator("password_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError(f"must be an environment variable name, not {v[:3]!r}... "
                             "(put the secret in the environment, its name here)")
        return v


class Host(Access):
    name: str = Field(pattern=_HOSTNAME)
    bmc: str = Field(min_length=1, max_length=253, description="BMC address (name or IP)")
    power_sensor: str | None = Field(default=None, max_length=64,
                                     description="SDR sensor holding total power (default: guessed)")
    metadata: Metadata = Field(default_factory=Metadata)


class Inventory(_Strict):
    defaults: Access = Field(default_factory=Access)
    hosts: list[Host] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> Inventory:
        seen: set[str] = set()
        for h in self.hosts:
            if h.name in seen:
                raise ValueError(f"host {h.name!r} appears twice")
            seen.add(h.name)
        return self


class Config(_Strict):
    """``collectors.ipmi`` section of opsloop.yaml."""

    inventory: Path | None = Field(default=None, description="YAML inventory file (defaults + hosts)")
    defaults: Access = Field(default_factory=Access)
    hosts: list[Host] = Field(default_factory=list, description="inline inventory")
    ipmitool: str = Field(default="ipmitool", min_length=1, description="ipmitool executable")
    interface: Literal["lanplus", "lan"] = "lanplus"
    cipher_suite: int = Field(default=3, ge=0, le=17, description="-C; without it ipmitool probes (~10 s)")
    privilege_level: Privilege = "ADMINISTRATOR"
    retransmit_timeout_s: int = Field(default=1, ge=1, le=30, description="ipmitool -N")
    # ipmitool reads -R 0 as "unset" and retries 4 times (a dead BMC then costs 20 s): at least 1.
    retries: int = Field(default=1, ge=1, le=10, description="ipmitool -R")
    timeout_s: float = Field(default=6.0, gt=0, le=300, description="hard limit per BMC and round")
    concurrency: int = Field(default=16, ge=1, le=256, description="ipmitool processes at most")
    round_timeout_s: float = Field(default=55.0, gt=0, le=3600,
                                   description="BMCs not started by then are reported, not read")
    dcmi_recheck_rounds: int = Field(default=30, ge=1, description="re-probe DCMI on SDR-only BMCs")
    max_plausible_watts: float = Field(default=10_000.0, gt=0,
                                       description="larger readings are reported as parse errors")

    @model_validator(mode="after")
    def _some_hosts(self) -> Config:
        if self.inventory is None and not self.hosts:
            raise ValueError("give an inventory file (inventory: PATH) or inline hosts (hosts: [...])")
        return self


class ResolvedHost(BaseModel):
    """A host with its defaults applied: everything needed to read its BMC."""

    model_config = ConfigDict(frozen=True)

    name: str
    bmc: str
    port: int
    username: str | None
    password_file: Path | None
    password_env: str | None
    cipher_suite: int
    source: Source
    power_sensor: str | None
    metadata: Metadata


def load_inventory(path: Path) -> Inventory:
    try:   # the shared reader: one line, its size, depth and alias bounds (an alias bomb stalled the collector)
        doc = read_yaml(Path(path))
    except YamlFileError as e:
        raise InventoryError(f"inventory {path}: {e}") from None
    if not isinstance(doc, dict):
        raise InventoryError(f"inventory {path}: expected a mapping with 'hosts', got {type(doc).__name__}")
    try:
        return Inventory.model_validate(doc)
    except ValidationError as e:
        raise InventoryError(f"inventory {path}: {describe_validation_error(e)}") from None


def resolve_hosts(config: Config) -> list[ResolvedHost]:
    """Inline hosts plus the inventory file's, each with file defaults, then section defaults."""
    entries: list[tuple[Host, Access]] = [(h, config.defaults) for h in config.hosts]
    if config.inventory is not None:
        inv = load_inventory(config.inventory)
        merged = _merge(inv.defaults, config.defaults)
        entries += [(h, merged) for h in inv.hosts]
    out: list[ResolvedHost] = []
    seen: set[str] = set()
    for host, defaults in entries:
        if host.name in seen:
            raise InventoryError(f"host {host.name!r} is defined twice (inline and in the inventory?)")
        seen.add(host.name)
        h = _merge(host, defaults)
        if h.password_file is not None and h.password_env is not None:
            raise InventoryError(f"host {host.name!r}: give password_file or password_env, not both")
        out.append(ResolvedHost(
            name=host.name, bmc=host.bmc, port=h.port or 623, username=h.username,
            password_file=h.password_file, password_env=h.password_env,
            cipher_suite=config.cipher_suite if h.cipher_suite is None else h.cipher_suite,
            source=h.source or "auto", power_sensor=host.power_sensor, metadata=host.metadata,
        ))
    return out


def _merge(primary: Access, fallback: Access) -> Access:
    """Fields set on ``primary`` win; a password reference counts as one field (file or env)."""
    data = fallback.model_dump()
    own = primary.model_dump(exclude_unset=True, exclude_none=True)
    if "password_file" in own or "password_env" in own:
        data["password_file"] = data["password_env"] = None
    data.update({k: v for k, v in own.items() if k in Access.model_fields})
    return Access.model_validate(data)
