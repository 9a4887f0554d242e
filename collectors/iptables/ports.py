"""The list of VM ports that must be protected, from a file or a command.

Format (JSON or YAML; a top-level list, or a mapping with a ``ports`` list)::

    [{"port_id": "0695f2ca-bf4e-4a1e-9d6b-2f0a3c1d7e55", "device": "tap0695f2ca-bf",
      "vm": "web-1", "tenant": "acme"}]

``port_id`` is the Neutron port UUID (at least its first 11 characters); ``device`` defaults to
Neutron's ``tap`` + port_id[:11]; ``vm`` names the instance (uuid or name); ``tenant`` is optional.
Other keys are ignored, so the output of a script over ``openstack port list`` or ``virsh
domiflist`` can carry more. It can be generated e.g. with
``openstack port list --host $(hostname) -f json -c ID -c device_id`` piped through ``jq``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from opsloop.collectors.iptables.analyze import default_device
from opsloop.validation import YamlFileError, parse_yaml, read_yaml


class PortsError(ValueError):
    """The port list could not be read or is not in the documented format."""


class VmPort(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    port_id: str = Field(min_length=11, max_length=64, pattern=r"^[0-9a-f][0-9a-f-]+$")
    vm: str = Field(min_length=1, max_length=255)
    device: str = Field(default="", max_length=15, pattern=r"^[A-Za-z0-9_.:+-]*$")  # IFNAMSIZ-1
    tenant: str | None = Field(default=None, max_length=255)

    @model_validator(mode="after")
    def _device_default(self) -> "VmPort":
        if not self.device:
            object.__setattr__(self, "device", default_device(self.port_id))
        return self


_PORTS = TypeAdapter(list[VmPort])


def parse_ports(text: str, source: str) -> list[VmPort]:
    """Parse the port list (JSON is valid YAML, so one loader serves both): a command's output."""
    try:   # read_yaml's bounds and one-line errors: an alias bomb in the output stalled the collector
        doc: Any = parse_yaml(text) if text.strip() else []
    except YamlFileError as e:
        raise PortsError(f"{source}: {e}") from None
    return _ports(doc, source)


def _ports(doc: Any, source: str) -> list[VmPort]:
    if doc is None:   # an empty file: no ports yet
        doc = []
    if isinstance(doc, dict) and "ports" in doc:
        doc = doc["ports"]
    if not isinstance(doc, list):
        raise PortsError(f"{source}: expected a list of ports (or {{ports: [...]}}), got {type(doc).__name__}")
    try:
        ports = _PORTS.validate_python(doc)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise PortsError(f"{source}: ports.{loc}: {err['msg']} (got {err.get('input')!r:.80})") from None
    seen: set[str] = set()
    for p in ports:
        if p.port_id in seen:
            raise PortsError(f"{source}: port {p.port_id} listed twice")
        seen.add(p.port_id)
    return ports


def read_ports_file(path: Path) -> list[VmPort]:
    try:   # the shared reader: its size bound too (/dev/zero as ports_file was read until memory ran out)
        doc = read_yaml(path)
    except YamlFileError as e:
        raise PortsError(f"ports file {path}: {e}") from None
    return _ports(doc, f"ports file {path}")
