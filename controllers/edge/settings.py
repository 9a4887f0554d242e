"""Tunables of the edge-weight controllers, apart from the control law itself.

The config file (``controllers.edge.controller``) and the simulator's scenarios validate against
these models; keeping them here lets ``opsloop config check`` and every ``--help`` load without
the solver (SciPy) the control law needs. What each tunable does: :mod:`.controller`'s docstring.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from opsloop.validation import NoBoolNumbers


class ControllerSettings(NoBoolNumbers):   # `max_step: true` was a step of 100 %
    """Tunables of :class:`~opsloop.controllers.edge.controller.EdgeController` (seconds, shares
    in [0, 1])."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(default=15.0, gt=0)
    headroom: float = Field(default=0.05, ge=0.0, lt=0.5)
    max_step: float = Field(default=0.5, gt=0.0, le=1.0)
    relax_gain: float = Field(default=0.5, gt=0.0, le=1.0)
    relax_step: float = Field(default=0.2, gt=0.0, le=1.0)
    # a relax move of more than two relax steps whose gaining origins all stay this far below
    # their plan (predicted for worst-case elastic clients) goes at up to max_step: the traffic
    # a surge or a peak pushed away comes home in one or two intervals, not five (1 = off)
    clear_relax_margin: float = Field(default=0.10, ge=0.0, le=1.0)
    demand_window: int = Field(default=2, ge=1, le=100)
    elasticity: float = Field(default=1.0, ge=0.0, le=4.0)
    latency_floor_ms: float = Field(default=10.0, ge=0.0)
    stale_after_s: float = Field(default=30.0, gt=0.0)
    # between origins this close (ms) the current one keeps its share: a move for less is churn
    stickiness_ms: float = Field(default=0.5, ge=0.0)
    deadband: float = Field(default=0.005, ge=0.0, lt=0.5)
    hot_margin: float = Field(default=0.03, ge=0.0, le=0.05)
    shed_headroom: float = Field(default=0.08, ge=0.0, lt=0.5)
    # demand: plan on this upper quantile of the measured demand's interval-to-interval variability
    demand_quantile: float = Field(default=0.95, ge=0.5, lt=1.0)
    variability_window: int = Field(default=10, ge=3, le=100)
    max_uplift: float = Field(default=0.30, ge=0.0, le=1.0)
    # the uplift moves by at most this much per interval (a rate limit on the headroom it adds)
    uplift_rate: float = Field(default=0.02, gt=0.0, le=1.0)
    # above this uplift demand counts as noisy: planned on its mean level, not its latest maximum
    noisy_uplift: float = Field(default=0.03, ge=0.0, le=1.0)
    # the uplift may raise the plan's mean latency by at most this fraction (0: no limit)
    noise_latency_budget: float = Field(default=0.08, ge=0.0, le=1.0)
    anticipate_ramp: bool = True
    ramp_threshold: float = Field(default=0.015, ge=0.0, le=1.0)  # relative rise per interval
    # a slow ramp: the slope of the mean level of three edges or more (of each edge's own with
    # fewer) over this many readings, beyond slow_ramp_t standard errors of the fit
    slow_ramp_readings: int = Field(default=8, ge=4, le=100)
    slow_ramp_t: float = Field(default=4.0, ge=1.0, le=20.0)
    # the per-interval noise of one edge's measured demand at least (a ramp must clear it)
    ramp_noise_floor: float = Field(default=0.02, ge=0.0, le=1.0)
    # a step of demand seen in one interval's mean: the level planned is prev + this × the rise
    # (the step came on average mid-interval, and the clients take a while to reach it: a third
    # of the interval seen of it covers a step in the interval's first two thirds); 1 = off
    step_extrapolation: float = Field(default=3.0, ge=1.0, le=10.0)
    # a step: a rise beyond this many sd of one interval's change of an edge's demand (its noise)
    step_sigmas: float = Field(default=4.0, ge=1.0, le=20.0)
    # a step common to every edge (a flash crowd): their mean rise beyond this many sd of its noise
    common_step_sigmas: float = Field(default=3.5, ge=1.0, le=20.0)
    # a returning origin (HAProxy slowstart, Envoy outlier-ejection back-off): held down for
    # hold_down_intervals × backoff^(flaps-1) (≤ hold_down_max_intervals), then its capacity ramps
    # in over slowstart_intervals; its flap count is forgotten after it stayed up that long
    hold_down_intervals: float = Field(default=2.0, ge=0.0, le=1000.0)
    hold_down_backoff: float = Field(default=2.0, ge=1.0, le=10.0)
    hold_down_max_intervals: float = Field(default=6.0, ge=0.0, le=10000.0)
    # an origin back after an outage longer than hold_down_max_intervals is back from a repair,
    # not flapping: held down this long (its first healthy check), then ramped in as usual
    outage_hold_down_intervals: float = Field(default=1.0, ge=0.0, le=1000.0)
    slowstart_intervals: float = Field(default=4.0, ge=0.0, le=1000.0)
    # an origin overloaded within an interval whose mean load read within its capacity (its
    # answers slower than unloaded): on noisy demand its planned capacity is cut by this much
    # each time (at most max_derate), regained at derate_decay per interval; 0 = off
    hidden_overload_derate: float = Field(default=0.03, ge=0.0, le=0.5)
    derate_decay: float = Field(default=0.97, ge=0.0, le=1.0)
    max_derate: float = Field(default=0.15, ge=0.0, le=0.5)

    @model_validator(mode="after")
    def _steps(self) -> "ControllerSettings":
        if self.hold_down_max_intervals < self.hold_down_intervals:
            raise ValueError(f"hold_down_max_intervals: must be >= hold_down_intervals "
                             f"({self.hold_down_intervals!r}), got {self.hold_down_max_intervals!r}")
        if self.relax_step > self.max_step:
            raise ValueError(f"relax_step: must not exceed max_step ({self.max_step!r}), "
                             f"got {self.relax_step!r}")
        return self


class FixedStepSettings(NoBoolNumbers):
    """Tunables of :class:`~opsloop.controllers.edge.baselines.FixedStepController` (2 % per 15 s
    interval, no headroom)."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(default=15.0, gt=0)
    step: float = Field(default=0.02, gt=0.0, le=1.0)
    headroom: float = Field(default=0.0, ge=0.0, lt=0.5)
    stale_after_s: float = Field(default=45.0, gt=0.0)
