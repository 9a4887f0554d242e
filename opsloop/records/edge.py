"""The edge control loop's records: ``edge.demand`` (what each edge offered its origins, from the stream
stage) and ``edge.weights`` (the share per origin the controller decided, for the actuators).

Numbers are numbers and ``up`` a JSON bool (:mod:`opsloop.records.base`): ``"version": true`` was version 1,
``{"weights": {"eu": true}}`` a share of 1, ``"up": 0`` a server down. Names (edge, backend, listener, origin)
are at most :data:`MAX_NAME_CHARS` characters. All refused at decode, naming the field."""

from __future__ import annotations

import enum
import math
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from opsloop.argtypes import INT64_MAX
from opsloop.records.base import Flag, Integer, JsonRecord, Number
from opsloop.validation import LAST_TIME_MS, check_number

SHARE_SUM_TOLERANCE = 1e-6
# no measurement: a rate above 1e12 req/s, a response time above 1e9 ms (the edge controller's LP
# takes nothing beyond them as a number; one such reading in its inputs failed its ticks)
MAX_RATE_RPS = 1e12
MAX_RESPONSE_MS = 1e9
# HAProxy's status of a server ("UP 1/3", "MAINT (resolution)"): a few words. Bounded, so that one
# server's 1 MB status does not make every record of its backend too big for Kafka (1 MB).
MAX_STATUS_CHARS = 64
# The ranges of a decision's stamp, checked at the record so every reader refuses the same ones at decode: a
# version a signed 64-bit integer holds (`weights rollback --to`, JSON readers, the actuators' history), an epoch
# (a controller's start time in ms) up to 9999-12-31T23:59:59.999Z. Beyond them a record decoded, then every
# reader refused it its own way (the actuators at apply, the controller's recovery) or failed on it.
MAX_VERSION = INT64_MAX
LAST_EPOCH = LAST_TIME_MS
# An edge's, backend's, listener's or origin's name: the stream stage cuts HAProxy's names to 256 characters (a
# label's bound, opsloop.streams.runtime.gauges), the topology and the actuators' config allow 200.
MAX_NAME_CHARS = 256
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]


class OriginState(BaseModel):
    """One server (origin) as the edge sees it."""

    model_config = ConfigDict(extra="forbid")

    rps: Number = Field(ge=0.0, le=MAX_RATE_RPS, allow_inf_nan=False)
    up: Flag = True
    status: str = Field(default="", max_length=MAX_STATUS_CHARS)
    # HAProxy ``rtime`` (ms, mean over its last 1024 requests); None when the stats had no value
    rtime_ms: Number | None = Field(default=None, ge=0.0, le=MAX_RESPONSE_MS, allow_inf_nan=False)


class EdgeDemand(JsonRecord):
    """The ``edge.demand`` record: key ``f"{backend}|{edge}"``."""

    RECORD = "edge demand record"

    edge: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    backend: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    demand_rps: Number = Field(ge=0.0, le=MAX_RATE_RPS, allow_inf_nan=False)
    origins: dict[Name, OriginState] = Field(default_factory=dict)
    timestamp: Number = Field(gt=0.0, allow_inf_nan=False)  # event time of the newest rate used

    @property
    def key(self) -> str:
        return f"{self.backend}|{self.edge}"


class Mode(str, enum.Enum):
    """How a decision was made."""

    NORMAL = "normal"      # optimal assignment, every edge fully served
    SHED = "shed"          # healthy capacity short: shares serve the same fraction of every edge
    HOLD = "hold"          # fail static: last good weights kept (stale inputs / nothing usable)
    FALLBACK = "fallback"  # nothing usable and no last good weights: a static fallback


def check_shares(value: dict[str, float]) -> dict[str, float]:
    """``value`` when it is a share distribution (each in [0, 1], summing to 1), else ValueError naming
    what is wrong; also the actuators' check of a decision built without validation."""
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


class EdgeWeights(JsonRecord):
    """The decision for one listener and edge: a share per origin, summing to 1.

    ``version`` increases whenever the published weights change, so applying the same version twice
    is a no-op for an actuator. ``shed`` reports a shortfall (``{"rps": ..., "fraction": ...}``).

    ``epoch`` is the generation of the controller instance that made the decision: each start of the
    edge control service takes a new, higher one (its start time in ms, above every epoch it recovered
    from ``edge.weights``). Actuators order decisions by ``(epoch, version)``, so a controller that
    restarts at a lower version (history lost, recovery cut short) still wins over its predecessor,
    and a predecessor that keeps running is refused (``stale_version``, alerted). Records without it
    (older controllers) have epoch 0. ``version`` is at most :data:`MAX_VERSION`, ``epoch`` at most
    :data:`LAST_EPOCH`: a record beyond them is refused at decode (:class:`RecordError` naming the field).
    """

    RECORD = "edge weights record"

    version: Integer = Field(ge=0)
    epoch: Integer = Field(default=0, ge=0)
    listener: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    edge: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    weights: dict[Name, Number] = Field(min_length=1)
    computed_at: Number = Field(ge=0.0, allow_inf_nan=False)
    mode: Mode = Mode.NORMAL
    reason: str = ""
    inputs_age_s: Number = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    shed: dict[str, Number] = Field(default_factory=dict)

    @field_validator("version")
    @classmethod
    def _version(cls, value: int) -> int:
        if value > MAX_VERSION:
            raise ValueError(f"above {MAX_VERSION} (2**63 - 1), the largest version a reader holds")
        return value

    @field_validator("epoch")
    @classmethod
    def _epoch(cls, value: int) -> int:
        if value > LAST_EPOCH:
            raise ValueError(f"after {LAST_EPOCH} (9999-12-31T23:59:59.999Z in ms); an epoch is a controller's "
                             "start time in ms")
        return value

    @field_validator("weights")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        return check_shares(value)

    @field_validator("shed")
    @classmethod
    def _shed(cls, value: dict[str, float]) -> dict[str, float]:
        for key, amount in value.items():
            check_number(f"shed[{key!r}]", amount)
        return value

    @property
    def stamp(self) -> tuple[int, int]:
        """The order of decisions: ``(epoch, version)``."""
        return (self.epoch, self.version)
