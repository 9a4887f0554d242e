"""Changes made through the edge API, kept in a file so that a restart does not undo them.

The topology file stays the operator's (often managed by configuration management, so the service
never rewrites it); API changes are an overlay on top of it: capacities, pinned health and latencies
per listener, written atomically (temporary file, fsync, rename) after every change and applied on
start. The topology file decides what exists: an overlay entry naming a listener, edge or origin no
longer in it is skipped with a warning. An overlay that cannot be read stops the start with an error
naming the file, because starting without it could, for example, send traffic to an origin an
operator had drained. Values are validated by the same functions as the topology file and the API
(:func:`opsloop.controllers.edge.model.check_capacity`, :func:`~opsloop.controllers.edge.model.check_latency`): a NaN,
negative, infinite or absurd capacity in the file stops the start naming the field, instead of
failing every controller tick after it. Types are strict, as the API's: a capacity ``true`` or ``"5"``,
a pin ``"false"`` or ``0``, a version ``"1"`` stop the start too (read leniently they were a capacity of
1 and 5 req/s and a drained origin, which no API call could have saved).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from opsloop.atomic_file import replace_file
from opsloop.controllers.edge.model import check_capacity, check_latency
from opsloop.validation import describe_validation_error

VERSION = 1


class OverridesError(ValueError):
    """The overrides file exists but cannot be used (the message names it and what to do)."""


class Overrides(BaseModel):
    # strict: what the API refuses (a bool capacity, a pin that is no bool) is refused here too, not converted
    model_config = ConfigDict(extra="forbid", strict=True)

    version: int = VERSION
    capacity_rps: dict[str, dict[str, float]] = Field(default_factory=dict)          # listener -> origin -> rps
    health: dict[str, dict[str, bool]] = Field(default_factory=dict)                  # listener -> origin -> pinned
    latency_ms: dict[str, dict[str, dict[str, float | None]]] = Field(default_factory=dict)  # listener -> edge -> origin
    health_forced: dict[str, list[str]] = Field(default_factory=dict)   # listener -> origins pinned up over DOWN

    @model_validator(mode="after")
    def _values(self) -> "Overrides":
        for lst, origins in self.capacity_rps.items():
            for o, v in origins.items():
                check_capacity(f"capacity_rps[{lst!r}][{o!r}]", v)
        for lst, edges in self.latency_ms.items():
            for e, row in edges.items():
                for o, ms in row.items():
                    if ms is not None:
                        check_latency(f"latency_ms[{lst!r}][{e!r}][{o!r}]", ms)
        for lst, origins in self.health_forced.items():
            for o in origins:
                if self.health.get(lst, {}).get(o) is not True:
                    raise ValueError(f"health_forced[{lst!r}]: {o!r} is forced up but not pinned healthy")
        return self

    def count(self) -> int:
        return (sum(len(v) for v in self.capacity_rps.values()) + sum(len(v) for v in self.health.values())
                + sum(len(o) for e in self.latency_ms.values() for o in e.values()))


def load_overrides(path: Path) -> Overrides:
    if not path.exists():
        return Overrides()
    hint = f"fix or delete {path} to start from the topology file alone"
    try:
        doc: Any = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise OverridesError(f"edge API overrides {path}: cannot be read ({e}); {hint}") from None
    try:
        out = Overrides.model_validate(doc)
    except ValidationError as e:
        raise OverridesError(f"edge API overrides {path}: {describe_validation_error(e)}; {hint}") from None
    if out.version != VERSION:
        raise OverridesError(f"edge API overrides {path}: version {out.version} unsupported (expected {VERSION}); "
                             f"{hint}")
    return out


def save_overrides(path: Path, overrides: Overrides) -> None:
    """Atomic: a crash leaves the previous file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, overrides.model_dump_json(indent=2).encode())
