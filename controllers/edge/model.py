"""Domain model of the edge-weight control problem (source document: "Building A Smarter AWS Global
Accelerator", see docs/sources.md).

A *listener* (an anycast address:port) is served by *edges* (load balancers in edge sites) that
forward each request to one of the listener's *origins*. Per origin we know its capacity (req/s) and
health; per edge→origin pair the latency; per edge the demand (req/s). The decision is, per listener
and edge, a share per origin: an :class:`opsloop.records.EdgeWeights` record, versioned, on the
``edge.weights`` topic.

:class:`Topology` validates one listener's inputs and converts them to the dense arrays the
scheduler and controllers work on (rows = edges, columns = origins, in declaration order).
Validation errors name the field and the offending value.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from opsloop.validation import check_number

# Bounds of the inputs the scheduler's LP can work with. A latency above a minute is not a path a
# request should take (write null: no path); numbers near 1e20 make the LP fail every tick.
MAX_CAPACITY_RPS = 1e9
MAX_LATENCY_MS = 60_000.0


def check_capacity(field: str, value: Any) -> float:
    """The one validator of an origin's capacity (topology file, API, overrides file)."""
    return check_number(field, value, maximum=MAX_CAPACITY_RPS)


def check_latency(field: str, value: Any) -> float:
    """The one validator of an edge→origin latency in ms (``inf``: no path)."""
    return check_number(field, value, allow_inf=True, maximum=MAX_LATENCY_MS)


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
            check_number(f"demand_rps[{edge!r}]", rps)
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
