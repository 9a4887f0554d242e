"""Domain model of the edge-weight control problem (source document: "Building A Smarter AWS Global
Accelerator", see docs/sources.md).

A *listener* (an anycast address:port) is served by *edges* (load balancers in edge sites) that
forward each request to one of the listener's *origins*. Per origin we know its capacity (req/s) and
health; per edge→origin pair the latency; per edge the demand (req/s). The decision is, per listener
and edge, a share per origin: an :class:`EdgeWeights` record, versioned and encodable for the
``edge.weights`` topic.

:class:`Topology` validates one listener's inputs and converts them to the dense arrays the
scheduler and controllers work on (rows = edges, columns = origins, in declaration order).
Validation errors name the field and the offending value.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 1
SHARE_SUM_TOLERANCE = 1e-6
# Bounds of the inputs the scheduler's LP can work with. A latency above a minute is not a path a
# request should take (write null: no path); numbers near 1e20 make the LP fail every tick.
MAX_CAPACITY_RPS = 1e9
MAX_LATENCY_MS = 60_000.0


def _check_number(field: str, value: Any, *, allow_inf: bool = False, maximum: float = math.inf) -> float:
    """``value`` as a float when it is a finite number in ``[0, maximum]`` (``inf`` too when
    ``allow_inf``); else ValueError naming ``field`` and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field}: expected a number, got {value!r}")
    v = float(value)
    if math.isnan(v) or v < 0 or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{field}: expected a finite number >= 0, got {value!r}")
    if math.isfinite(v) and v > maximum:
        raise ValueError(f"{field}: {value!r} is above the largest accepted value {maximum:g}")
    return v


def check_capacity(field: str, value: Any) -> float:
    """The one validator of an origin's capacity (topology file, API, overrides file)."""
    return _check_number(field, value, maximum=MAX_CAPACITY_RPS)


def check_latency(field: str, value: Any) -> float:
    """The one validator of an edge→origin latency in ms (``inf``: no path)."""
    return _check_number(field, value, allow_inf=True, maximum=MAX_LATENCY_MS)


class Origin(BaseModel):
    """An origin data centre: the policy capacity (req/s) we must not exceed, and its health."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    capacity_rps: float
    healthy: bool = True

    @field_validator("capacity_rps", mode="before")
    @classmethod
    def _capacity(cls, value: Any) -> float:
        return check_capacity("capacity_rps", value)


class Edge(BaseModel):
    """An edge load balancer (an LVS/HAProxy node) that forwards a listener's traffic."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)


class Listener(BaseModel):
    """An anycast listener (e.g. ``192.0.2.10:443``) with the edges and origins that serve it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    edges: list[Edge] = Field(min_length=1)
    origins: list[Origin] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> "Listener":
        for kind, names in (("edges", [e.name for e in self.edges]),
                            ("origins", [o.name for o in self.origins])):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{kind}: duplicate name(s) {dupes!r} in listener {self.name!r}")
        return self


class Topology(BaseModel):
    """One listener's inputs: latency matrix (ms; ``inf`` or missing = no path) and demand (req/s)."""

    model_config = ConfigDict(extra="forbid")

    listener: Listener
    latency_ms: dict[str, dict[str, float]]
    demand_rps: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> "Topology":
        edges = {e.name for e in self.listener.edges}
        origins = {o.name for o in self.listener.origins}
        for edge, row in self.latency_ms.items():
            if edge not in edges:
                raise ValueError(f"latency_ms: unknown edge {edge!r} (edges: {sorted(edges)})")
            for origin, ms in row.items():
                if origin not in origins:
                    raise ValueError(f"latency_ms[{edge!r}]: unknown origin {origin!r} "
                                     f"(origins: {sorted(origins)})")
                check_latency(f"latency_ms[{edge!r}][{origin!r}]", ms)
        for edge, rps in self.demand_rps.items():
            if edge not in edges:
                raise ValueError(f"demand_rps: unknown edge {edge!r} (edges: {sorted(edges)})")
            _check_number(f"demand_rps[{edge!r}]", rps)
        return self

    @property
    def edge_names(self) -> list[str]:
        return [e.name for e in self.listener.edges]

    @property
    def origin_names(self) -> list[str]:
        return [o.name for o in self.listener.origins]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(demand[E], capacity[O], latency[E, O], healthy[O])``; a missing pair is ``inf``."""
        origins = self.origin_names
        demand = np.array([self.demand_rps.get(e, 0.0) for e in self.edge_names], dtype=float)
        capacity = np.array([o.capacity_rps for o in self.listener.origins], dtype=float)
        healthy = np.array([o.healthy for o in self.listener.origins], dtype=bool)
        latency = np.full((len(self.edge_names), len(origins)), np.inf)
        for i, edge in enumerate(self.edge_names):
            for j, origin in enumerate(origins):
                latency[i, j] = self.latency_ms.get(edge, {}).get(origin, math.inf)
        return demand, capacity, latency, healthy


class Mode(str, enum.Enum):
    """How a decision was made."""

    NORMAL = "normal"      # optimal assignment, every edge fully served
    SHED = "shed"          # healthy capacity short: shares serve the same fraction of every edge
    HOLD = "hold"          # fail static: last good weights kept (stale inputs / nothing usable)
    FALLBACK = "fallback"  # nothing usable and no last good weights: a static fallback


class EdgeWeights(BaseModel):
    """The decision for one listener and edge: a share per origin, summing to 1.

    ``version`` increases whenever the published weights change, so applying the same version twice
    is a no-op for an actuator. ``shed`` reports a shortfall (``{"rps": ..., "fraction": ...}``).

    ``epoch`` is the generation of the controller instance that made the decision: each start of the
    edge control service takes a new, higher one (its start time in ms, above every epoch it recovered
    from ``edge.weights``). Actuators order decisions by ``(epoch, version)``, so a controller that
    restarts at a lower version (history lost, recovery cut short) still wins over its predecessor,
    and a predecessor that keeps running is refused (``stale_version``, alerted). Records without it
    (older controllers) have epoch 0.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    version: int = Field(ge=0)
    epoch: int = Field(default=0, ge=0)
    listener: str = Field(min_length=1)
    edge: str = Field(min_length=1)
    weights: dict[str, float] = Field(min_length=1)
    computed_at: float = Field(ge=0.0, allow_inf_nan=False)
    mode: Mode = Mode.NORMAL
    reason: str = ""
    inputs_age_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    shed: dict[str, float] = Field(default_factory=dict)

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, value: int) -> int:
        if value != SCHEMA_VERSION:
            raise ValueError(f"schema_version: unsupported version {value!r} (know {SCHEMA_VERSION})")
        return value

    @field_validator("weights")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        for origin, share in value.items():
            if not origin:
                raise ValueError("weights: empty origin name")
            if isinstance(share, bool) or not isinstance(share, (int, float)) or math.isnan(share) \
                    or not 0.0 <= share <= 1.0:
                raise ValueError(f"weights[{origin!r}]: share must be in [0, 1], got {share!r}")
        total = math.fsum(value.values())
        if abs(total - 1.0) > SHARE_SUM_TOLERANCE:
            raise ValueError(f"weights: shares must sum to 1, got {total!r} for {value!r}")
        return value

    @field_validator("shed")
    @classmethod
    def _shed(cls, value: dict[str, float]) -> dict[str, float]:
        for key, amount in value.items():
            _check_number(f"shed[{key!r}]", amount)
        return value

    @property
    def stamp(self) -> tuple[int, int]:
        """The order of decisions: ``(epoch, version)``."""
        return (self.epoch, self.version)

    def encode(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

    @classmethod
    def decode(cls, raw: bytes | str) -> "EdgeWeights":
        try:
            doc: Any = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"edge weights record: not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ValueError(f"edge weights record: expected a JSON object, got {type(doc).__name__}")
        return cls.model_validate(doc)
