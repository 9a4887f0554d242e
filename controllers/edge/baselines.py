"""The baselines our law is judged against: the LP target on the measured demand, pushed at most
``step`` (2 %) per origin per interval (:class:`FixedStepController`, kind ``fixed-step``) or all at
once (:class:`UndampedController`, which oscillates with latency-elastic clients)."""

from __future__ import annotations

import numpy as np

from opsloop.controllers.edge.base import Controller, Observation, Proposal
from opsloop.controllers.edge.safety import strip_unusable, usable_mask
from opsloop.controllers.edge.scheduler import Solution, solve
from opsloop.controllers.edge.settings import FixedStepSettings

_EPS = 1e-12


class _LPTargetController(Controller):
    """Baselines: the LP target on the measured demand, then their own way of pushing it."""

    def __init__(self, n_edges: int, n_origins: int, settings: FixedStepSettings | None = None,
                 initial: np.ndarray | None = None, origin_names: list[str] | None = None) -> None:
        self.settings = settings or FixedStepSettings()
        super().__init__(n_edges, n_origins, self.settings.stale_after_s, 1.0, initial, origin_names)

    def _lp_target(self, obs: Observation) -> tuple[np.ndarray, Solution]:
        estimate = np.asarray(obs.demand, dtype=float)   # fresh: finite, >= 0 (Controller.step)
        return estimate, solve(estimate, obs.capacity, obs.latency, obs.healthy, previous=self.weights,
                               headroom=self.settings.headroom)


class FixedStepController(_LPTargetController):
    """The fixed-step baseline: same LP target, each origin's share moved ≤ ``step`` per interval."""

    name = "fixed-step"

    def _propose(self, obs: Observation) -> Proposal:
        estimate, solution = self._lp_target(obs)
        target = solution.weights
        if self.weights is None:
            proposal = target
        else:
            current = strip_unusable(self.weights, target, usable_mask(obs.latency, obs.healthy),
                                     obs.latency)
            delta = target - current
            biggest = np.abs(delta).max(axis=1, keepdims=True)
            proposal = current + delta * np.minimum(1.0, self.settings.step / np.maximum(biggest, _EPS))
        return Proposal.of(proposal, solution, estimate,
                           f"damped {self.settings.step:.0%} per origin per interval")


class UndampedController(_LPTargetController):
    """Push the LP target every interval (oscillates with elastic demand)."""

    name = "undamped"

    def _propose(self, obs: Observation) -> Proposal:
        estimate, solution = self._lp_target(obs)
        return Proposal.of(solution.weights, solution, estimate, "target applied undamped")

