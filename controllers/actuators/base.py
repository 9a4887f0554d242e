"""The two protocols of the actuator layer.

A :class:`Target` is one load balancer's view of one listener on one edge: read the integer weight
of each origin, write them as one batch, say which origins it reports DOWN. An :class:`Actuator`
applies a whole :class:`~opsloop.records.EdgeWeights` decision to a target with every safety
rule (:class:`opsloop.controllers.actuators.applier.EdgeActuator`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from opsloop.records import EdgeWeights


class ActuatorError(RuntimeError):
    """The target refused or could not be reached; ``kind`` is the error-metric label."""

    def __init__(self, message: str, kind: str = "unreachable") -> None:
        super().__init__(message)
        self.kind = kind


class Target(Protocol):
    kind: str         # "haproxy" or "lvs"
    max_weight: int   # highest integer weight the target accepts
    # True when the LB's health checker takes a dead server to weight 0 instead of marking it DOWN
    # (LVS with keepalived/ldirectord): any weight written to it would revive it, so it is held at 0
    quiesces: bool

    @property
    def origins(self) -> list[str]: ...

    def describe(self) -> str: ...

    def read(self) -> dict[str, int]: ...

    def write(self, weights: dict[str, int]) -> None: ...

    def down(self, stored: dict[str, int] | None = None) -> set[str]:
        """Origins the LB reports DOWN; ``stored`` (the weights last applied) lets a quiescing target
        tell a server its health checker set to 0 from one the actuator set to 0."""
        ...

    def left_alone(self) -> dict[str, str]:
        """Origins whose server the target does not write, as of its last :meth:`down`: origin -> why. Their live
        weight is kept (no drift, not read back); empty for a target that writes every server (LVS)."""
        ...


# Results written to the audit trail and the applies metric.
RESULTS = ("applied", "noop", "refused", "held", "stale_version", "rolled_back", "dry_run", "shadow",
           "mismatch", "failed")


@dataclass
class ApplyResult:
    result: str                                  # one of RESULTS
    version: int | None
    reason: str = ""
    before: dict[str, int] | None = None         # live integer weights read before acting
    after: dict[str, int] | None = None          # integer weights written (or that would be)
    shares: dict[str, float] = field(default_factory=dict)  # shares applied (after the step bound)
    complete: bool = True                        # False: step-bounded, more steps to the decision
    stale: bool = False                          # the decision was too old (fail static)
    error: str | None = None

    @property
    def retry(self) -> bool:
        """Worth retrying later (the target was unreachable or failed)."""
        return self.result == "failed"


class Actuator(Protocol):
    def read(self) -> dict[str, int]: ...

    def apply(self, weights: EdgeWeights) -> ApplyResult: ...
