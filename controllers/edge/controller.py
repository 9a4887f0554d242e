"""Edge-weight controllers: turn the optimal assignment into the weights pushed each interval.

The loop ("Building A Smarter AWS Global Accelerator"): edges report their request rate every
interval; we push weights; clients react to the latency those weights cause (a far origin lowers
their request rate) and origins slow down when overloaded. Moving at most 2 % per origin per 15 s
interval (:class:`FixedStepController`) is stable but takes minutes to move 30 % of traffic;
applying the target at once (:class:`UndampedController`) oscillates.

Control law of :class:`EdgeController` (one step per interval, weights ``W`` per edge × origin)
-----------------------------------------------------------------------------------------------
1. *Demand estimate* (:class:`~opsloop.controllers.edge.demand.DemandModel`). The max of the
   last ``demand_window`` (2) measurements — a rise is seen at once, a fall after 2 intervals.
   On a *ramp* (three rises in a row, ``ramp_threshold`` per interval on average and clearly
   above the measured noise — σ at least ``ramp_noise_floor``, as σ read off a few draws runs
   low and three noisy draws then read as a ramp — or two large ones, read once σ is known; one
   still rising stays a ramp; an interval of a big latency change counts with its smaller reading, raw or
   corrected by the elasticity seen, unless it holds a step) one more interval of it is added; a step (a big rise, then the clients'
   transient) is not carried on, nor read as a ramp when the two calm intervals before it
   happened to rise. With three edges or more, two rises of the median across edges
   (its noise ~1/√E of one edge's; one edge surging leaves it flat) make a ramp common to them:
   every edge not clearly falling gets that rise, though its own may hide in its noise; so do
   three positive median rises, none a step, whose mean clears the threshold and 3 sd of its
   noise (σ at least ``ramp_noise_floor``, 2 %: a few early draws read it low); so does a slower
   one, the least-squares slope of the edges' mean level over ``slow_ramp_readings`` (8) beyond
   ``slow_ramp_t`` (4) standard errors of the fit, unless a level shift fits the window twice as
   well (a step). With one or two edges there is no common level: each edge's own slope over
   the same window, by the same test, makes its ramp (not across a change beyond the step bar:
   a surge is the step's). The ramp's rise
   is the larger of the raw one and the clients' own (corrected by the elasticity seen: our
   sheds slow elastic clients and hide part of it). A *step* seen in part in one interval's
   mean (a rise beyond 4 sd of the noise over a calm level; or on every edge, their mean rise
   beyond ``common_step_sigmas`` (3.5) sd of its own noise: a listener-wide flash crowd) is
   planned for one tick on level + ``step_extrapolation`` (3) × the rise, an origin over
   capacity on it hot at once (:meth:`DemandModel._step_level`; read across a latency change
   the step made itself, its origins slowing down, but not across one of our weights;
   the rebound of the clients it slowed is not compounded on the extrapolation; not when the
   origin's response time contradicts the reading; into a shortfall on the levels measured, a step
   common to every edge on the measured shares at the total it implies). The *variability* of
   the clients' own demand (measurements corrected for the latency our weights gave them, so
   our own moves are not read as noise) is
   the median absolute deviation of second differences of log-demand (a step or a ramp leaves it
   alone; a step beyond 25 % and 4σ and the clients' lag that carries it into the next interval
   are left out, as with few draws between our moves they set it), held at its peak and decaying slowly; the plan covers the ``demand_quantile`` (95 %)
   of it: demand × (1 + max(0, z·σ − headroom)), that uplift moving by at most
   ``uplift_rate`` (2 points) per interval, as σ read off a few draws jumps, and scaled down
   until the plan's mean latency is within ``noise_latency_budget`` (8 %) of the plan without
   it (a far alternative makes the headroom cost more than the draws it covers:
   :meth:`EdgeController._within_latency_budget`). When that uplift is clear (``noisy_uplift``),
   the window's mean level (since the edge's latency last moved by more than 10 %) replaces
   the max of the last draws (unless a draw is beyond 3σ), so the weights do not chase noise.
   Demand drawn afresh within an interval overloads the near origin for part of it while the
   interval's mean reads within capacity: an origin that answered slower than unloaded then
   (beyond its own jitter), on noisy demand and away from steps, ramps and plant changes, has
   its planned capacity cut by ``hidden_overload_derate``
   (3 %) each time, at most ``max_derate`` (15 %), regained at ``derate_decay`` (0.97) per
   interval (:meth:`EdgeController._hidden_overload_derate`); the cut and the uplift share the
   latency budget. Every measurement is kept with the latency its clients saw.
2. *Hold-down* (:class:`~opsloop.controllers.edge.holddown.HoldDown`): an origin that comes
   back healthy is planned as absent for ``hold_down_intervals`` × ``hold_down_backoff``^(flaps−1)
   (≤ ``hold_down_max_intervals``; the flap count is forgotten after that long without a change),
   then its capacity ramps in over ``slowstart_intervals`` — Envoy's outlier-ejection back-off
   and HAProxy's ``slowstart``. An edge with no other healthy origin may use it at once (that
   edge only: the others keep off it until its hold-down ends). A flapper up for twice its longest
   up-spell of the storm (≥ one interval more) has stopped: whole capacity at once, fast relax.
3. *Target* ``T = solve(D̂, capacity, latency, healthy, previous=W, headroom=h)`` (h = 5 %) on
   the demand the clients will send once no origin is overloaded (*rebound*): when the telemetry
   gives origins' response times (``Observation.origin_latency_ms``), each measurement is grown
   from the latency its clients saw to the latency of the same weights at unloaded speed, with
   the elasticity seen across our own moves (−Δln rate/Δln latency over a move of > 10 %, not
   one made while a demand step was still settling; the worst case ``elasticity`` until one was
   seen), then on what they will send at the plan's own weights (origins unloaded; a rise with
   the elasticity seen, a fall only as far as a fit over all our moves, less two standard
   errors, shows it: noisy open-loop demand shows none), the point where plan and demand agree
   bracketed and halved a few rounds. In a shortfall: on what the clients will send at the
   plan's weights, the origins answering as they do now (bracketed alike; a fall only as far
   as one was seen), so an edge moved far is not put all back on its near origin on the demand
   it sent from afar.
4. *Shed jointly and at once.* An origin is *hot* when its offered load at the current weights
   (worst-case prediction) exceeds capacity by ``hot_margin`` (3 %), or exceeds capacity for a
   second interval running, or while its response time is more than that margin above its
   unloaded one (the overload is real, and the slow answers hide demand). Then every edge moves toward the joint plan with ``shed_headroom``
   (8 %) in one step — the edge that makes room on an origin moves in the same step as the one
   shed onto it — and what ``max_step`` keeps an edge from moving off an origin stays there in
   the plan while the LP places the rest around it (:meth:`EdgeController._bounded_shed`). A
   ramp that will carry an origin past its plan gets the same joint move with the normal
   headroom, before the origin is over (:meth:`EdgeController._make_room`): it takes no traffic
   onto an origin above its plan unless the plan's chain of moves leaves the most loaded origin
   lower, and gives an origin no more than keeps it within its plan for worst-case elastic
   clients. Above capacity but within the margin (*warm*), by more than one σ of the load's
   measurement noise: a ``relax_gain`` fraction of the decrease per interval. A reading over capacity that
   the origin's own response time contradicts (an origin seen to slow down when overloaded
   that answered at its unloaded speed all through the interval) is measurement noise:
   nothing is shed, eased or relieved for it. In a
   shortfall an origin is hot only
   above the common overload factor by the margin on the estimate and, on the last
   measurement, by 2σ of the demand noise (3–5 %) as well; above it on the estimate and by one σ
   of its own reading (≥ 1.5 %) on the measurement, it is warm (else the shares stay put).
   Demand within the normal headroom but not the shed's: the shed is planned at the normal
   headroom (the deeper plan is a shortfall's, which keeps the shares), an edge moved nearer
   only as far as keeps the origins it gains within capacity for clients as elastic as seen
   across our moves (the worst case until seen), or beyond it below the overload then left on
   the hot origins by more than ``hot_margin``.
5. *Relax slowly and safely.* The rest of ``T − W`` is applied as ``β·(T − W)``, β ≤ ``relax_gain``
   (0.5), ``β·|T − W|∞ ≤ relax_step`` (0.2), β the largest for which every origin that gains
   traffic keeps a *predicted* load ≤ capacity·(1−h), assuming worst-case elastic clients
   (each measurement grown by (L_seen/L(W))^ε, ε = ``elasticity`` = 1, never assumed to fall:
   worst cases of successive moves do not compound). Hysteresis: when nothing is hot or warm, a
   relax move is made only if it lowers latency-weighted traffic on the planned demand; an
   origin between its plan and its capacity is left alone. A long way home (more than two relax
   steps: a surge or a peak over) onto origins that stay ``clear_relax_margin`` (10 %) below
   their plan for those clients goes at up to ``max_step`` instead, unless it relieves an origin,
   one is hot or warm, or an origin it fills came back from a failure within twice the longest
   hold-down and ramp-in (the hold-down governs that one).
6. *Final guard* (:func:`~opsloop.controllers.edge.safety.enforce_safety`, applied to every
   controller by :meth:`~opsloop.controllers.edge.base.Controller.step`): shares off an unhealthy or
   unreachable origin move at once; other changes ≤ ``max_step`` (0.5) per origin per interval;
   rows sum to 1, are never all-zero, and put nothing on an unhealthy origin while a healthy one is
   reachable; a row with none holds its weights, but moves what is on an origin it has no path
   to onto the reachable ones (those requests fail for certain). Stale inputs (``inputs_age_s > stale_after_s``) hold the last good weights
   (``mode=hold``, with a reason); health known fresh apart from them (``health_age_s``) still moves
   the share off an origin it calls down, to where a plan on the last demand seen has room.

Why it is stable
----------------
* A shed moves traffic to farther origins: network latency rises, elastic demand falls; the one
  effect that pushes demand back up — the relieved origin answering faster — is predicted from
  its response times (when known) and planned for, and the 8 % shed headroom covers the rest, so
  one step suffices; a shed larger than ``max_step`` is completed on other edges in the same step.
* Relaxing never fills an origin past its plan even for the most elastic clients, so the loop
  cannot alternate between shedding and relaxing; each relax step closes a fixed fraction of the
  remaining gap (a contraction). The undamped iteration diverges when demand elasticity times the
  latency gap outweighs the share; the worst-case prediction removes that factor from the step.
* Noise: the plan follows the measured variability (a quantile, not the mean), the gap between
  plan (95 %) and hot (103 %) is a dead band, moves below ``deadband`` are skipped, and a
  flapping origin earns nothing back until it has stayed healthy.
* In a shortfall (demand above all healthy capacity) the LP shares the excess proportionally, so
  every origin carries the same overload factor; no rebound is expected there. It is planned
  on the demand at its own weights, so the plan does not chase itself (an edge moved far sends
  less, moved back it sends more).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from opsloop.controllers.edge.base import Controller, Decision, Observation, Proposal
from opsloop.controllers.edge.baselines import FixedStepController, UndampedController
from opsloop.controllers.edge.demand import DemandModel, big_moves, mean_latency
from opsloop.controllers.edge.holddown import HoldDown
from opsloop.controllers.edge.response import ResponseTimes
from opsloop.controllers.edge.safety import enforce_safety, strip_unusable, usable_mask
from opsloop.controllers.edge.scheduler import MAX_RATE, Solution, solve
from opsloop.controllers.edge.settings import ControllerSettings

# the controllers' public names, importable from here as before the law was split into modules
__all__ = ["Controller", "Decision", "EdgeController", "FixedStepController", "HoldDown",
           "Observation", "Proposal", "UndampedController", "big_moves", "enforce_safety",
           "strip_unusable", "usable_mask"]

_EPS = 1e-12


def largest_fraction(fits: Callable[[float], bool], upper: float = 1.0,
                     rounds: int = 20) -> float:
    """The largest b in [0, ``upper``] with ``fits(b)`` (``upper`` if it fits, else bisected
    ``rounds`` times from 0, which is taken to fit)."""
    if fits(upper):
        return upper
    lo, hi = 0.0, upper
    for _ in range(rounds):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def origin_sigma(carried: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """[O] σ of each origin's load in req/s: the edges' relative noise ``sigma`` [E], independent,
    weighted by what each sends there (``carried`` [E, O] req/s)."""
    return np.sqrt(((carried * sigma[:, None]) ** 2).sum(axis=0))


class EdgeController(Controller):
    """Our controller: shed jointly and at once, relax with a worst-case-elastic prediction, plan
    on an upper quantile of demand, hold down flapping origins (module docstring)."""

    name = "ours"

    def __init__(self, n_edges: int, n_origins: int, settings: ControllerSettings | None = None,
                 initial: np.ndarray | None = None, origin_names: list[str] | None = None) -> None:
        self.settings = settings or ControllerSettings()
        super().__init__(n_edges, n_origins, self.settings.stale_after_s, self.settings.max_step,
                         initial, origin_names)
        s = self.settings
        # the clients' demand, its variability and elasticity (step 1 of the law)
        self.demand = DemandModel(n_edges, s)
        self._last_latency: np.ndarray | None = None
        self.hold_down = HoldDown(n_origins, s)
        self._over_last = np.zeros(n_origins, dtype=bool)
        self.response = ResponseTimes(n_origins)  # what the origins' response times say
        # [O] req/s each origin carried over the last interval (the weights in force, the demand
        # read); None before the first weights
        self._load_read: np.ndarray | None = None
        # per origin: the cut of its planned capacity for overload within intervals read within
        # it (:meth:`_hidden_overload_derate`), its response time's own jitter at low load, and
        # the intervals since a step, a ramp or a change of capacity or health
        self._derate = np.zeros(n_origins)
        self._calm_ticks = 0
        self._last_plant: tuple[np.ndarray, np.ndarray] | None = None

    # -- latency, demand and the origins' response times -----------------------------------------
    def _mean_latency(self, weights: np.ndarray, latency: np.ndarray,
                      service: np.ndarray | None = None) -> np.ndarray:
        """:func:`~opsloop.controllers.edge.demand.mean_latency` with this controller's
        ``latency_floor_ms``."""
        return mean_latency(weights, latency, service, self.settings.latency_floor_ms)

    def _latency_now(self, latency: np.ndarray) -> np.ndarray:
        return self._mean_latency(self.weights, latency, self.response.now)

    def _predicted_load(self, weights: np.ndarray, latency: np.ndarray,
                        elasticity: np.ndarray | float | None = None) -> np.ndarray:
        """[O] worst-case load at ``weights`` (:meth:`DemandModel.predicted_demand_at`)."""
        predicted = self.demand.predicted_demand_at(weights, latency, self.response.base, elasticity)
        return (weights * predicted[:, None]).sum(axis=0)

    def _demand_estimate(self, measured: np.ndarray, row_latency: np.ndarray, latency: np.ndarray | None = None,
                         healthy: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(estimate, uplift, rising): :meth:`DemandModel.update` on this interval's ``measured``
        rates read at ``row_latency``, our own move told by the latency of the weights in force
        at unloaded speed. An edge that had no origin up all interval (every one it reaches seen
        down at this tick or the last) and sent traffic to one that was down is unserved: its
        requests failed, no demand reading (an edge with another origin up is moved onto it,
        and its next reading is served)."""
        unloaded = None if self.weights is None or self._last_latency is None else \
            self._mean_latency(self.weights, self._last_latency, self.response.base)
        unserved = None
        if self.weights is not None and self.hold_down.up is not None and latency is not None and healthy is not None:
            up_all_interval = healthy & self.hold_down.up   # hold_down.up: the health at the last tick
            stranded = ~usable_mask(latency, up_all_interval).any(axis=1)
            unserved = stranded & (
                (self.weights * ~up_all_interval[None, :]).sum(axis=1) > self.settings.deadband)
        return self.demand.update(measured, row_latency, unloaded, unserved)

    def _noise_only(self, over: np.ndarray) -> np.ndarray:
        """[O]: origins read over capacity whose own response time says they were not: an origin
        whose answers were seen to slow down when it was overloaded, but that answered at its
        unloaded speed all through the interval, was within capacity, and the reading above it
        is measurement noise (one high draw shed ~10 points that the next intervals took back).
        An origin whose slowdown was never seen (or telemetry without response times) is
        believed on its reading alone, as before."""
        self.response.note_over(over)
        return over & ~self._over_last & self.response.answered_unloaded()

    def _hidden_overload_derate(self, capacity: np.ndarray, healthy: np.ndarray,
                                rising: np.ndarray) -> np.ndarray:
        """[O] the fraction of each origin's capacity the plan leaves unused for overload the
        interval means do not show. A reading is an interval's mean: demand drawn afresh several
        times an interval overloads the near origin for part of it while the mean reads within
        capacity, and σ of those means understates it (draws held 15 s in a 30 s interval:
        √2). The origin's own response time shows it: any second over capacity slows its answers.
        An origin that answered slower than unloaded (beyond its own jitter at low load) in an
        interval whose mean read within capacity, on noisy demand (an edge on it with σ beyond
        twice ``ramp_noise_floor``: demand noise, not measurement noise) and three intervals
        clear of a step, a ramp or a change of capacity or health (their transients slow an
        origin once), has its planned capacity cut by ``hidden_overload_derate``, at most
        ``max_derate``; the cut is regained at ``derate_decay`` per interval. On 40 noise draws
        of bench.sim_kinds a share held constant on each edge's nearest origin met the verdict
        on 31, in bands 1–4 points wide, where following the plan met 11 (edge README)."""
        s = self.settings
        last, self._last_plant = self._last_plant, (capacity.copy(), healthy.copy())
        changed = last is not None and not (np.array_equal(last[0], capacity)
                                            and np.array_equal(last[1], healthy))
        self._calm_ticks = 0 if changed or self.demand.stepped.any() or rising.any() \
            else self._calm_ticks + 1
        if self.response.now is None or self.weights is None or s.hidden_overload_derate <= 0:
            return self._derate
        read = self._load_read / np.maximum(capacity, _EPS)
        jitter = self.response.jitter(healthy & (read <= 0.8))
        on = self.weights > s.deadband
        noisy = (on & (self.demand.sigma > 2.0 * s.ramp_noise_floor)[:, None]).any(axis=0)
        slowed = self.response.slowed(np.maximum(1e-3, 1.5 * jitter))
        hidden = healthy & (read <= 1.0) & noisy & slowed & (self._calm_ticks >= 3)
        self._derate = np.where(hidden, np.minimum(self._derate + s.hidden_overload_derate,
                                                   s.max_derate), self._derate * s.derate_decay)
        return self._derate

    def _drop_contradicted_steps(self, estimate: np.ndarray, capacity: np.ndarray,
                                 healthy: np.ndarray) -> np.ndarray:
        """A step whose reading alone puts an origin over capacity while that origin answered
        at its unloaded speed all interval is the origin's measurement noise (see
        :meth:`_noise_only`), not a step: planned on the level measured."""
        if not self.demand.stepped.any() or self.response.now is None or self.weights is None:
            return estimate
        read = (self.weights * self.demand.unstepped[:, None]).sum(axis=0)
        contradicted = healthy & (read > capacity + 1e-9) & self.response.answered_unloaded()
        on_it = (self.weights[:, contradicted] > self.settings.deadband).any(axis=1)
        drop = self.demand.stepped & on_it
        if not drop.any():
            return estimate
        return self.demand.unstep(drop, estimate)

    def _plan(self, estimate: np.ndarray, capacity: np.ndarray, latency: np.ndarray,
              healthy: np.ndarray, headroom: float, fixed: np.ndarray | None = None):
        """The LP target on the demand the clients will send once no origin is overloaded.

        Each of the last ``demand_window`` measurements is grown from the latency its clients
        saw to the latency of the same weights with every origin answering at its unloaded
        speed (the *rebound* of a relieved origin's clients), with the elasticity seen across
        our own moves (:meth:`DemandModel.elasticity_seen`). What a move toward nearer origins
        adds is the relax step's business (worst case, every step); planning it into the target
        would push traffic away on a demand that only arrives if the traffic stays near.

        ``fixed`` [E, O]: shares that stay where they are (what the step bound cannot move this
        interval); the LP plans the rest of each edge's demand on the capacity they leave."""
        s = self.settings
        relieved = np.maximum(estimate, self.demand.relieved_demand()) if self.weights is not None \
            else estimate

        def plan_on(demand: np.ndarray):
            demand = np.minimum(demand, MAX_RATE)   # a rebound's growth of a demand near the bound
            if fixed is None:
                return solve(demand, capacity, latency, healthy, previous=self.weights,
                             headroom=headroom, stickiness_ms=s.stickiness_ms)
            free = np.clip(1.0 - fixed.sum(axis=1), 0.0, 1.0)
            pinned = (fixed * demand[:, None]).sum(axis=0)
            room = np.clip(capacity - pinned / (1.0 - headroom), 0.0, None)
            sol = solve(demand * free, room, latency, healthy, previous=self.weights,
                        headroom=headroom, stickiness_ms=s.stickiness_ms)
            sol.weights = fixed + sol.weights * free[:, None]
            sol.weights /= np.maximum(sol.weights.sum(axis=1, keepdims=True), _EPS)
            return sol

        sol = plan_on(relieved)
        if sol.status == "optimal":
            if self.weights is None or not any(self.demand.fall_obs):
                return sol, relieved
            # clients moved to a farther origin slow down by the elasticity seen across our own
            # moves: planned on what they sent nearer, a shed moved 12 % of a closed-loop
            # edge's traffic (20 vs 150 ms) where 3 % relieved the origin, its load fell to
            # 41 % of capacity and the relax steps back took six intervals. The plan is made
            # on the demand at its own weights (origins unloaded; a fall only as far as one
            # was seen). The plan moves the demand the other way (more demand, more moved
            # away, less sent): the plan kept is one whose demand covers what they send at it
            return self._agreeing_plan(plan_on, sol, relieved, lambda w: self.demand.demand_at(
                w, latency, self.response.base), optimal_only=True)
        # a shortfall: the origins stay loaded, no relief to expect; the excess is shared on
        # what the clients will send at the plan's weights. Elastic clients moved back onto
        # their near origin speed up, moved off it slow down: planned on what an edge sent
        # at other weights, the plan put a far-moved edge (sending half as much) all back on
        # its near origin (overloaded by 68 %, shed again: a different origin every interval)
        # or kept one moved in by a shed off its near origin (it fell 16 % below the others).
        # Each recent measurement is taken from the latency its clients saw to the plan's,
        # the origins answering as they do now
        demand = estimate
        sol = sol if np.allclose(relieved, estimate) else plan_on(estimate)
        if self.weights is None:
            return sol, demand
        at_plan = self._loaded_demand_at(sol.weights, latency, capacity)
        if np.allclose(at_plan, demand, rtol=0.01, atol=0.0):
            return sol, demand
        # bracketed as above (averaged rounds stopped on a plan whose clients sent two thirds
        # of what it was made on: the LP's shares jump, and a 4 x 4 mesh's origins stayed
        # 9-20 % apart for seven intervals)
        return self._agreeing_plan(plan_on, sol, demand,
                                   lambda w: self._loaded_demand_at(w, latency, capacity),
                                   at_plan)

    @staticmethod
    def _agreeing_plan(plan_on: Callable[[np.ndarray], Solution], sol: Solution,
                       demand: np.ndarray, clients_send: Callable[[np.ndarray], np.ndarray],
                       at_plan: np.ndarray | None = None, optimal_only: bool = False
                       ) -> tuple[Solution, np.ndarray]:
        """The plan whose demand covers what its clients send at its weights: ``sol`` was made on
        ``demand`` and moves it the other way (more demand, more moved away, less sent), so the
        point where they agree is bracketed per edge and halved a few rounds. With
        ``optimal_only``, a trial that turns into a shortfall is too much demand. Without a
        covering plan: the bracket's upper end, as near as the rounds came (with
        ``optimal_only``, ``sol`` if that one is a shortfall too)."""
        if at_plan is None:
            at_plan = clients_send(sol.weights)
        best = (sol, demand) if (at_plan <= demand * (1 + 1e-9)).all() else None
        lo, hi = np.minimum(demand, at_plan), np.maximum(demand, at_plan)
        for _ in range(6):
            if np.allclose(lo, hi, rtol=0.01, atol=0.0):
                break
            trial_demand = np.sqrt(lo * hi)
            trial = plan_on(trial_demand)
            if optimal_only and trial.status != "optimal":
                hi = trial_demand
                continue
            covered = clients_send(trial.weights) <= trial_demand * (1 + 1e-9)
            hi = np.where(covered, trial_demand, hi)
            lo = np.where(covered, lo, trial_demand)
            if covered.all():
                best = (trial, trial_demand)
        if best is None:
            trial = plan_on(hi)
            best = (trial, hi) if not optimal_only or trial.status == "optimal" \
                else (sol, demand)
        return best

    def _loaded_demand_at(self, weights: np.ndarray, latency: np.ndarray,
                          capacity: np.ndarray) -> np.ndarray:
        """Demand at ``weights`` with the origins answering as they do now (a shortfall keeps
        them loaded): each of the last ``demand_window`` measurements taken from the latency its
        clients saw to the latency at ``weights`` (a rise with the elasticity seen across our own
        moves, a fall only with one seen); the largest, times the estimate's ramp/variability
        factor. An edge on a slowed origin may be planned to send less too: every origin stays
        overloaded at the common factor, none is relieved to its unloaded speed (held at its
        rate, an edge moved off a slowed origin onto a far one was planned at the demand it no
        longer sent, and the far origin was filled a little more each interval: 0.70, 0.77,
        0.88 of the common factor). An origin the plan relieves from a deeper overload answers
        faster than it does now, and its clients send more (:meth:`_relieved_service`)."""
        demand = self.demand.demand_at(weights, latency, self.response.now, loaded=True)
        service = self._relieved_service(weights, demand, capacity)
        if service is None:
            return demand
        return self.demand.demand_at(weights, latency, service, loaded=True)

    def _relieved_service(self, weights: np.ndarray, demand: np.ndarray, capacity: np.ndarray
                          ) -> np.ndarray | None:
        """[O] response times at the loads ``weights`` put on the origins with ``demand``, for
        the origins the plan relieves from a deeper overload than they carried in the last
        interval (more than 5 % over capacity and slowed): from their unloaded speed at
        capacity to the speed read at the last load, linear in between (two points read, no
        queueing model assumed); every other origin as it answers now. ``None`` if none is.
        Held at their slow answers, the clients of an origin shed from 162 % toward a common
        factor of 131 % were planned at 791 req/s and sent 895 once it answered faster: it ran
        at 141 % for an interval, 7 % above the common factor (``bench.sim_kinds`` shortfall
        41 #3). See :meth:`ResponseTimes.at_loads`."""
        if self._load_read is None:
            return None
        cap = np.maximum(capacity, _EPS)
        return self.response.at_loads(self._load_read / cap,
                                      (weights * demand[:, None]).sum(axis=0) / cap)

    def _bounded_shed(self, current: np.ndarray, estimate: np.ndarray, capacity: np.ndarray,
                      latency: np.ndarray, healthy: np.ndarray, plan_healthy: np.ndarray,
                      headroom: float | None = None) -> tuple[np.ndarray, bool]:
        """The joint shed plan (deeper headroom), made to fit the per-interval step bound: what
        an edge cannot move off an origin this interval (its share beyond ``max_step``) stays
        there in the plan, and the LP places everything else around it, so the origin is
        relieved by the edges that can move (not by lowering its capacity until it empties).
        Also whether the demand is within the normal headroom only (*tight*): the plan is then
        made at that headroom, as the deeper one's is a shortfall's (it keeps the shares)."""
        s = self.settings
        headroom = max(s.shed_headroom, s.headroom) if headroom is None else headroom
        # from the weights in force: a share on an unusable origin moves freely (to where the
        # plan wants it), as the final guard will move it
        base = self.weights if self.weights is not None else current
        usable = usable_mask(latency, plan_healthy)
        fixed = np.where(usable, np.clip(base - s.max_step, 0.0, None), 0.0)
        sol, _ = self._plan(estimate, capacity, latency, plan_healthy, headroom)
        tight = False
        if sol.status != "optimal" and headroom > s.headroom:
            # the deeper plan is a shortfall's, which keeps the shares: two origins at 103 %
            # stayed there for 240 s while the normal headroom's plan had room for them
            normal, _ = self._plan(estimate, capacity, latency, plan_healthy, s.headroom)
            if normal.status == "optimal":
                sol, headroom, tight = normal, s.headroom, True
        if sol.status != "optimal" or not fixed.any():
            # a shortfall: the common overload factor needs every edge's share
            return sol.weights, tight
        pinned, _ = self._plan(estimate, capacity, latency, plan_healthy, headroom, fixed)
        return (pinned.weights if pinned.status == "optimal" else sol.weights), tight

    def _make_room(self, current: np.ndarray, target: np.ndarray, estimate: np.ndarray,
                   latency: np.ndarray, healthy: np.ndarray, load: np.ndarray,
                   cap_plan: np.ndarray) -> np.ndarray:
        """The step toward the joint plan ``target`` that makes room ahead of a ramp.

        Two candidates, the one that leaves the most loaded origin lowest (against its plan,
        worst-case elastic clients) is taken: the plan's move as it is, and the move with no
        gain on an origin already above its plan (the plan's rebound estimate may route an
        edge back onto it mid-ramp; but with every near origin above its plan, that one cannot
        move an edge off its origin onto another that an edge of its own leaves for a far one:
        a mesh's origin ran 1 % over while the plan's chain of moves stood still). Each goes as
        far as keeps every origin it sends traffic to within its plan (worst-case elastic clients)."""
        above = healthy & (load > cap_plan + 1e-9)
        candidates = []
        for clip in (True, False):
            move = target - current
            if clip:
                move[:, above] = np.minimum(move[:, above], 0.0)
                # the rest of each edge's move is scaled so the shares it frees and takes match
                gain, give = np.clip(move, 0.0, None), np.clip(-move, 0.0, None)
                both = np.minimum(gain.sum(axis=1), give.sum(axis=1))
                gain *= np.divide(both, gain.sum(axis=1), out=np.zeros_like(both),
                                  where=gain.sum(axis=1) > _EPS)[:, None]
                give *= np.divide(both, give.sum(axis=1), out=np.zeros_like(both),
                                  where=give.sum(axis=1) > _EPS)[:, None]
                move = gain - give
            gaining = healthy & ((move * estimate[:, None]).sum(axis=0) > 1e-9)

            def room(b: float, move=move, gaining=gaining) -> bool:
                pred = self._predicted_load(current + b * move, latency)
                return bool((pred[gaining] <= cap_plan[gaining] * (1 + 1e-9) + 1e-9).all())

            step = current + largest_fraction(room) * move
            worst = float((self._predicted_load(step, latency)[healthy]
                           / np.maximum(cap_plan[healthy], _EPS)).max(initial=0.0))
            candidates.append((worst, not clip, step))
        return min(candidates, key=lambda c: (c[0], c[1]))[2]

    def _within_latency_budget(self, estimate: np.ndarray, uplift: np.ndarray,
                               capacity: np.ndarray, derate: np.ndarray, latency: np.ndarray,
                               healthy: np.ndarray
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                          tuple[Solution, np.ndarray] | None]:
        """(estimate, uplift, derate, plan) with the variability uplift and the capacity cut for
        hidden overload (:meth:`_hidden_overload_derate`) scaled down together, every edge and
        origin alike, until the plan's mean latency is within ``noise_latency_budget`` of the
        plan without them.
        Covering a noisy demand's upper quantile moves traffic to farther origins for as long as
        the noise lasts; with a far alternative (100 ms against an 8 ms origin) a few points of it cost
        20 % more latency, for draws the near origin mostly absorbs. The budget keeps that cost
        inside the 10 % the control criteria allow over the fixed-step baseline; what the scaled
        plan does not cover is left to the hot and warm rules on the measured load. Judged on
        the plan itself (rebound included): a handful of plans, only on noisy demand; the one
        for the uplift kept is returned (``_plan``'s result; ``None``: not planned here)."""
        s = self.settings
        if s.noise_latency_budget <= 0 or self.weights is None \
                or not ((uplift > 0).any() or (derate > 0).any()):
            return estimate, uplift, derate, None
        bare = estimate / (1.0 + uplift)
        plans: dict[float, tuple[Solution, np.ndarray]] = {}

        def plan_latency(k: float) -> float | None:
            self.demand.set_scale(bare * (1.0 + k * uplift))  # the rebound's demand carries it too
            plans[k] = self._plan(bare * (1.0 + k * uplift), capacity * (1.0 - k * derate),
                                  latency, healthy, s.headroom)
            sol = plans[k][0]
            if sol.status != "optimal":
                return None  # a shortfall: its shares are not a latency choice
            per_edge = self._mean_latency(sol.weights, latency, self.response.base)
            return float((per_edge * bare).sum() / max(float(bare.sum()), _EPS))

        without, full = plan_latency(0.0), plan_latency(1.0)
        k = 1.0
        if without is not None and full is not None \
                and full > without * (1 + s.noise_latency_budget):
            lo, hi = 0.0, 1.0
            for _ in range(6):
                mid = (lo + hi) / 2
                at = plan_latency(mid)
                lo, hi = (mid, hi) if at is not None and at <= without * (
                    1 + s.noise_latency_budget) else (lo, mid)
            k = lo
        self.demand.set_scale(bare * (1.0 + k * uplift))
        return bare * (1.0 + k * uplift), k * uplift, k * derate, plans.get(k)

    def _held_down_plant(self, now: float, latency: np.ndarray, capacity: np.ndarray,
                         healthy: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(healthy, latency, capacity) the plans see under the hold-down, each origin's usable
        fraction of capacity, and the origins rescued: a returning origin is planned as absent,
        then with a ramping capacity; an edge that has nothing else healthy may use it at once
        (that edge only)."""
        usable_fraction = self.hold_down.update(now, healthy)
        plan_healthy = healthy & (usable_fraction > 0)
        stranded = usable_mask(latency, healthy).any(axis=1) & \
            ~usable_mask(latency, plan_healthy).any(axis=1)
        rescue = np.zeros_like(healthy)
        plan_latency = latency  # what the plans may use: a rescued origin only by those edges
        if stranded.any():
            rescue = healthy & np.isfinite(latency[stranded]).any(axis=0)
            # only the stranded edges: another edge moved onto an origin still in its hold-down
            # loses that share again if it flaps (the hold-down is there to prevent just that)
            plan_latency = latency.copy()
            plan_latency[np.ix_(~stranded, rescue & ~plan_healthy)] = math.inf
            plan_healthy |= rescue
            usable_fraction = np.where(rescue, 1.0, usable_fraction)
        plan_capacity = capacity * np.where(plan_healthy, usable_fraction, 1.0)
        return plan_healthy, plan_latency, plan_capacity, usable_fraction, rescue

    def _above_common_factor(self, current: np.ndarray, offered: np.ndarray, reading: np.ndarray,
                             capacity: np.ndarray, healthy: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray]:
        """(hot, over) in a shortfall, at the weights ``current``: every origin is over capacity
        by design; an origin is hot only when it carries more than the common overload factor
        by the margin, on the ``offered`` estimate and on the last ``reading`` alike, else the
        shares stay (re-planning every interval on noisy demand only swings the load); over
        (warm unless hot): above the factor by a measurement's noise."""
        s = self.settings
        # origins are compared with each other here: two edges' noise apart (≤ 5 %)
        margin = min(0.05, max(s.hot_margin, 2.0 * float(self.demand.sigma.max(initial=0.0))))

        def above_common(rows: np.ndarray, margin: float | np.ndarray) -> np.ndarray:
            carried = (current * rows[:, None]).sum(axis=0)
            factor = carried[healthy].sum() / max(float(capacity[healthy].sum()), _EPS)
            return healthy & (carried > capacity * max(factor, 1.0) * (1 + margin) + 1e-9)
        # on the estimate and on the last measurement alike: the estimate's per-edge max of
        # noisy draws alone can put one origin above the others when none is (a common
        # step's measurement at the total it implies: the reading holds part of the step)
        hot = above_common(offered, s.hot_margin) & above_common(reading, margin)
        # within the margin but above the common factor on the estimate and, on the last
        # measurement, by one σ of the origin's reading (≥ 1.5 %): warm, a relax_gain fraction
        # of the move as over capacity below (read 4.4 % above it with the margin at 5 %, an
        # origin was left 5.5 % above it, where the simulator's verdict allows 5 %)
        read_carried = current * reading[:, None]
        ratio_sd = origin_sigma(read_carried, self.demand.sigma) / np.maximum(
            read_carried.sum(axis=0), _EPS)
        near = np.minimum(margin, np.maximum(0.015, ratio_sd))
        return hot, hot | (above_common(offered, 0.0) & above_common(reading, near))

    def _tight_shed(self, current: np.ndarray, target: np.ndarray, estimate: np.ndarray,
                    latency: np.ndarray, capacity: np.ndarray, healthy: np.ndarray,
                    hot: np.ndarray) -> np.ndarray:
        """The shed's move toward ``target`` when demand is near all capacity (within the normal
        headroom only): an edge the shed moves nearer speeds up (elastic clients moved off a
        94 ms origin onto their 8.5 ms one sent 70 % more, that origin at 165 %); the move goes
        as far as keeps every origin it gains within capacity for clients as elastic as seen
        across our moves, or beyond it below the overload left on the ``hot`` origins."""
        s = self.settings
        move = target - current
        gaining = healthy & ((move * estimate[:, None]).sum(axis=0) > 1e-9)
        # clients as elastic as seen across our moves (the worst case until seen): with
        # the worst case kept, each interval's move only halved an edge's latency (a
        # rate doubling predicted), and the hot origin waited out the halvings
        seen_eps = self.demand.elasticity_seen()[None, :]

        def gains_fit(b: float) -> bool:
            # ... or, beyond capacity, below the overload the hot origins it relieves
            # are left with by more than the margin: worst-case clients moved onto a
            # 1 ms path are predicted at 100x their rate, and on constant feasible
            # demand an origin of capacity 0 kept its load for 26 intervals
            pred = self._predicted_load(current + b * move, latency, seen_eps)
            ratio = np.divide(pred, capacity, out=np.full_like(pred, np.inf),
                              where=capacity > _EPS)
            allowed = max(1.0, float(ratio[hot].max(initial=1.0)) / (1 + s.hot_margin))
            return bool((ratio[gaining] <= allowed * (1 + 1e-9) + 1e-9).all())
        return current + largest_fraction(gains_fit) * move

    def _relax_fraction(self, after_shed: np.ndarray, relax: np.ndarray, biggest: float,
                        estimate: np.ndarray, latency: np.ndarray, healthy: np.ndarray,
                        cap_plan: np.ndarray, *, relieves: bool, hot_or_warm: bool, now: float
                        ) -> tuple[float, bool, bool]:
        """(β, limited, fast): the fraction of the ``relax`` move (its largest share ``biggest``)
        made from ``after_shed``. At most ``relax_gain`` and ``relax_step``; as large as keeps
        every origin the move fills within its plan (``cap_plan``) for worst-case elastic
        clients (``limited``: that bound held it back); the whole move when what is left would
        be under the dead band; a long way home onto origins ``clear_relax_margin`` below their
        plan at up to ``max_step`` (``fast``); 0 when the step is under the dead band."""
        s = self.settings
        limited = fast = False
        beta_max = min(s.relax_gain, s.relax_step / biggest)
        # an origin the move sends more traffic to must end within its plan; one it takes
        # traffic off (or leaves alone) only must not get worse
        gaining = (relax * estimate[:, None]).sum(axis=0) > 1e-9
        ceiling = np.where(gaining, cap_plan, np.maximum(
            cap_plan, self._predicted_load(after_shed, latency)))

        def under(limit: np.ndarray) -> Callable[[float], bool]:
            def check(b: float) -> bool:
                pred = self._predicted_load(after_shed + b * relax, latency)
                return bool((pred[healthy] <= limit[healthy] * (1 + 1e-9) + 1e-9).all())
            return check

        fits = under(ceiling)
        # … and the origins it fills clear_relax_margin below their plan, worst case
        clear = under(np.where(gaining, cap_plan * (1.0 - s.clear_relax_margin), ceiling))

        beta_full = min(1.0, s.relax_step / biggest)
        beta_clear = min(1.0, s.max_step / biggest)
        # a long way home on origins with room to spare (a surge or a peak over): faster than
        # the relax step, but not for a move that relieves an origin (noise chasing), not
        # while an origin is hot or warm, and not onto an origin back from a failure lately
        # (its hold-down and ramp-in govern it: a flapping origin's churn; settled implies
        # both are over)
        clear_way = s.clear_relax_margin < 1.0 and biggest > 2.0 * s.relax_step \
            and not (relieves or hot_or_warm) \
            and bool((~gaining | self.hold_down.settled(now))[healthy].all())
        if biggest * (1.0 - beta_max) < s.deadband and fits(beta_full):
            beta = beta_full  # close in: finish the move instead of leaving slivers behind
        elif clear_way and clear(beta_clear):
            beta = beta_clear
            fast = True
        else:  # the largest step that keeps the prediction under the ceiling
            beta = largest_fraction(fits, beta_max, rounds=30)
            limited = beta < beta_max
        if beta * biggest < s.deadband:
            beta = 0.0
        return beta, limited, fast

    def _propose(self, obs: Observation) -> Proposal:
        s = self.settings
        measured = np.asarray(obs.demand, dtype=float)   # fresh: finite, >= 0 (Controller.step)
        self._load_read = None if self.weights is None \
            else (self.weights * measured[:, None]).sum(axis=0)
        latency = np.asarray(obs.latency, dtype=float)
        self.response.observe(obs.origin_latency_ms)
        self._last_latency = latency
        in_force = self._latency_now(latency) if self.weights is not None \
            else np.ones(len(measured))
        healthy = np.asarray(obs.healthy, dtype=bool)
        estimate, uplift, rising = self._demand_estimate(measured, in_force, latency, healthy)
        # the plan's demand stays what the LP takes: a step's extrapolation of a valid reading
        # near the bound went past it, and every tick raised until the step left the window
        estimate = np.minimum(estimate, MAX_RATE)
        self.demand.set_scale(estimate)
        capacity = np.asarray(obs.capacity, dtype=float)
        plan_healthy, plan_latency, plan_capacity, usable_fraction, rescue = \
            self._held_down_plant(float(obs.now), latency, capacity, healthy)
        derate = self._hidden_overload_derate(capacity, healthy, rising)
        # not into a shortfall: its shares are the common overload factor's, not a headroom
        if not estimate.sum() < (plan_capacity * (1.0 - derate))[plan_healthy].sum() * (
                1.0 - s.headroom):
            derate = np.zeros_like(derate)
        estimate = self._drop_contradicted_steps(estimate, capacity, healthy)
        estimate, planned_uplift, derate, budget_plan = self._within_latency_budget(
            estimate, uplift, plan_capacity, derate, plan_latency, plan_healthy)
        plan_capacity = plan_capacity * (1.0 - derate)
        solution, planned = budget_plan or self._plan(estimate, plan_capacity, plan_latency,
                                                      plan_healthy, s.headroom)
        step_scale = 1.0
        if solution.status == "shed" and self.demand.stepped.any():
            # a shortfall shares the excess in proportion to what each edge sends: a step's
            # extrapolated level (a guess) would skew the shares, so it is planned on the level
            # measured, as a shortfall is (no relief to expect either); a step common to every
            # edge on the measured shares at the total it implies
            if self.demand.stepped.all():
                step_scale = float(estimate.sum() / max(float(self.demand.unstepped.sum()), _EPS))
            estimate = np.minimum(self.demand.unstep(np.ones(self.n_edges, dtype=bool), estimate,
                                                     step_scale), MAX_RATE)
            solution, planned = self._plan(estimate, plan_capacity, plan_latency, plan_healthy,
                                           s.headroom)
        target = solution.weights
        if self.weights is None:  # first decision: nothing to damp against
            return Proposal.of(target, solution, estimate, f"initial assignment ({solution.status})")

        usable = usable_mask(latency, healthy)
        current = strip_unusable(self.weights, target, usable, latency)
        cap_plan = plan_capacity * (1.0 - s.headroom)
        # offered load: what the clients would send at these weights if no origin slowed them
        # down (an overloaded origin's slow answers hide part of the demand until it is relieved)
        offered = estimate if solution.status != "optimal" else np.maximum(  # a shortfall stays loaded
            estimate, self.demand.predicted_demand_at(current, latency, self.response.base))
        load = (current * offered[:, None]).sum(axis=0)
        over = healthy & (load > capacity + 1e-9)
        read_over = over.copy()  # for the reason: over capacity, acted on or not
        # a reading over capacity that the origin's own response time contradicts is noise:
        # neither shed nor eased off, nor relieved by a relax step below
        noise_only = np.zeros_like(over)
        if self.response.now is not None and solution.status == "optimal":
            noise_only = self._noise_only(over)
            over = over & ~noise_only
        # hot: over capacity by more than the noise margin, or over it a second interval running,
        # or with its answers more than that margin slower than unloaded: the overload is real,
        # and an origin slowed down by it hides part of its demand from the reading
        slowed = self.response.slowed(s.hot_margin)
        # (a step's extrapolated load is no noisy reading: beyond the noise by construction)
        stepping = ((current * self.demand.stepped[:, None]) > s.deadband).any(axis=0)
        hot = over & ((load > capacity * (1 + s.hot_margin) + 1e-9) | self._over_last | slowed
                      | stepping)
        self._over_last = over
        if solution.status == "shed":
            hot, over = self._above_common_factor(current, offered, measured * step_scale,
                                                  capacity, healthy)
        # a ramp that will carry an origin past its plan: make room now, jointly, not after
        ramping_up = healthy & (load > cap_plan + 1e-9) & \
            ((current * rising[:, None]) > s.deadband).any(axis=0)
        joint = False
        if ramping_up.any() and not hot.any():
            target, _ = self._bounded_shed(current, estimate, plan_capacity, plan_latency,
                                           healthy, plan_healthy, s.headroom)
            target = self._make_room(current, target, estimate, latency, healthy, load, cap_plan)
            joint = True
        if hot.any():
            # shed deeper than the plan, and move every edge at once toward the joint plan: the
            # edge that makes room on an origin moves in the same step as the one shed onto it
            target, tight = self._bounded_shed(current, estimate, plan_capacity, plan_latency,
                                               healthy, plan_healthy)
            if tight:
                target = self._tight_shed(current, target, estimate, latency, capacity, healthy,
                                          hot)
            joint = True
        delta = target - current

        # σ of each origin's load: the edges' measurement noise, independent, weighted by what
        # each sends there (where the headroom covers it; see the relax step below)
        carried = current * offered[:, None]
        quiet_sigma = np.where(uplift > s.noisy_uplift, 0.0, self.demand.sigma)
        load_sigma = origin_sigma(carried, quiet_sigma)
        # an origin above capacity but within the margin (warm): a relax_gain fraction of the
        # decrease, the freed share spread over the increases; not on a reading within one σ of
        # capacity (the next reading over capacity makes it hot all the same)
        warm = over & ~hot & (load > capacity + load_sigma + 1e-9)
        if joint:
            shed_move = delta
        else:
            gain = np.where(warm, s.relax_gain, 0.0)
            cut = np.where(delta < 0, -delta * gain[None, :], 0.0)
            rise = np.clip(delta, 0.0, None)
            rise_total = rise.sum(axis=1)
            freed = cut.sum(axis=1)
            spread = np.divide(freed, rise_total, out=np.zeros_like(freed), where=rise_total > _EPS)
            shed_move = -cut + rise * spread[:, None]
        after_shed = current + shed_move
        relax = delta - shed_move

        beta = 0.0
        limited = fast = False
        biggest = float(np.abs(relax).max()) if relax.size else 0.0
        finite_latency = np.where(np.isfinite(latency), latency, 0.0)
        # judged on the demand the target was planned on (the LP's own objective): on today's
        # demand a swap that the rebound makes worthwhile can look neutral and stall for good
        latency_gain = float((planned[:, None] * relax * finite_latency).sum())
        # hysteresis: an origin between its plan (capacity·(1-h)) and its capacity is left alone;
        # a move is only worth making when it lowers latency (toward nearer origins) or takes
        # load off an origin that is above its plan (a ramp, a held-down origin's ramp-in)
        # "above its plan" must be more than one measurement's noise above it: the load is read
        # off the largest of the last noisy measurements, and with clients that slow down on the
        # far origin one share point moves the near origin's load by several per cent, so a move
        # off it on a single high draw swings the load back and forth (σ of the load: the edges'
        # measurement noise, independent, weighted by what each sends there). Only where the
        # headroom covers that noise: demand noisier than that is planned with an uplift beyond
        # noisy_uplift, whose moves are not noise-chasing but the plan for it (a smaller uplift,
        # from a σ estimate at the headroom's edge, left no margin at all)
        above_plan = healthy & (load > cap_plan + load_sigma + 1e-9) & ~noise_only
        relieves = bool((np.where(relax < 0, -relax, 0.0)[:, above_plan]).sum() > s.deadband)
        if biggest > s.deadband and (latency_gain < 0 or relieves):
            beta, limited, fast = self._relax_fraction(
                after_shed, relax, biggest, estimate, latency, healthy, cap_plan,
                relieves=relieves, hot_or_warm=bool(hot.any() or warm.any()), now=float(obs.now))
        proposal = after_shed + beta * relax

        reason = self._reason(
            obs, latency, healthy, capacity, load, proposal, target, solution, usable_fraction,
            rescue=rescue,
            hot=hot, warm=warm, joint=joint, ramping_up=ramping_up, read_over=read_over,
            noise_only=noise_only, uplift=uplift, planned_uplift=planned_uplift, derate=derate,
            beta=beta,
            biggest=biggest, limited=limited, fast=fast,
            wants_move=latency_gain < 0 or relieves)
        return Proposal.of(proposal, solution, estimate, reason, target=target)

    def _reason(self, obs: Observation, latency: np.ndarray, healthy: np.ndarray,
                capacity: np.ndarray, load: np.ndarray, proposal: np.ndarray, target: np.ndarray,
                solution: Solution, usable_fraction: np.ndarray, *, rescue: np.ndarray,
                hot: np.ndarray, warm: np.ndarray, joint: bool, ramping_up: np.ndarray,
                read_over: np.ndarray, noise_only: np.ndarray, uplift: np.ndarray,
                planned_uplift: np.ndarray, derate: np.ndarray, beta: float,
                biggest: float, limited: bool, wants_move: bool, fast: bool) -> str:
        """What this step does and why, true of the weights pushed (after the final guard)."""
        s = self.settings
        # the weights step() will push: the guard is deterministic, so the text can name them
        final = enforce_safety(self.weights, proposal, latency, healthy, s.max_step)
        shortfall = solution.status == "shed"

        def loads(o: int) -> str:
            return f"{load[o]:.0f}/{capacity[o]:.0f} req/s"

        parts = []
        above = "the common overload factor" if shortfall else "capacity"
        # easing is said only of an origin whose share the pushed weights lower: the easing follows
        # the target's moves, and a target that keeps the origin's share eases nothing
        eased = warm & ((self.weights - final) > 1e-9).any(axis=0)
        if eased.any():
            parts.append(f"easing off origin(s) above {above} {self._names(eased, loads)}")
        if (warm & ~eased).any():
            parts.append(f"origin(s) {self._names(warm & ~eased, loads)} above {above} within the "
                         f"margin: share kept, the target moves nothing off it")
        if hot.any() and shortfall:
            parts.append(f"shed off origin(s) {self._names(hot, loads)} above the common overload "
                         f"factor, every edge moved jointly")
        elif hot.any():
            parts.append(f"shed off overloaded origin(s) {self._names(hot, loads)}, "
                         f"every edge moved jointly")
        if joint and not hot.any():
            if (np.abs(final - self.weights) > 1e-9).any():
                parts.append(f"making room ahead of a ramp on origin(s) {self._names(ramping_up, loads)}")
            else:
                parts.append(f"a ramp heading past the plan on origin(s) {self._names(ramping_up, loads)}: "
                             f"no move of the plan makes room")
        # over capacity but not acted on this interval: said, so no text reads as all is well
        if not shortfall:
            if (read_over & noise_only).any():
                parts.append(f"origin(s) {self._names(read_over & noise_only, loads)} read over "
                             f"capacity while answering at unloaded speed: taken as measurement noise")
            quiet_over = read_over & ~noise_only & ~hot & ~warm
            if quiet_over.any():
                parts.append(f"origin(s) {self._names(quiet_over, loads)} read over capacity "
                             f"within the measurement noise: acted on if it repeats")
        # "holding down" only for an origin held at weight 0 on every edge (the live test counts
        # such decisions as held ticks with the origin's weight 0)
        in_hold = self.hold_down.held(float(obs.now)) & healthy
        unused = (final == 0.0).all(axis=0)
        if (in_hold & unused).any():
            parts.append(f"holding down returning origin(s) {self._names(in_hold & unused)}")
        if (in_hold & ~unused & rescue).any():
            parts.append(f"returning origin(s) {self._names(in_hold & ~unused & rescue)} used "
                         f"before its hold-down ends: the only healthy origin of some edge")
        if (in_hold & ~unused & ~rescue).any():
            parts.append(f"moving off returning origin(s) {self._names(in_hold & ~unused & ~rescue)} "
                         f"in its hold-down")
        ramping = healthy & ~in_hold & (usable_fraction < 1.0)
        if ramping.any():
            parts.append("ramping in origin(s) " + self._names(
                ramping, lambda o: f"at {usable_fraction[o]:.0%} of capacity"))
        if (planned_uplift < uplift - 1e-9).any():
            parts.append(f"demand planned {planned_uplift.max():.0%} above the estimate (its "
                         f"variability), of {uplift.max():.0%}: held to the "
                         f"{s.noise_latency_budget:.0%} latency budget")
        elif (uplift > 0).any():
            parts.append(f"demand planned {uplift.max():.0%} above the estimate (its variability)")
        cut = derate >= 0.005
        if cut.any():
            parts.append("origin(s) " + self._names(cut, lambda o: f"planned at {1 - derate[o]:.0%}")
                         + " of capacity: overloaded within intervals read within it")
        if beta > 0:
            parts.append(f"relax toward target, step {beta:.2f} of the gap" + (
                f" (the origins it fills stay {s.clear_relax_margin:.0%} below their plan: up to "
                f"{s.max_step:.0%} of an edge's traffic)" if fast else ""))
        elif not (warm.any() or joint):
            # nothing moved by the law this interval: say why
            if not healthy.any():
                parts.append("holding the last weights: no healthy origin")
            elif shortfall:
                parts.append("shares kept: no origin above the common overload factor")
            elif biggest <= s.deadband:
                # edges with no usable origin hold their weights: the message says which
                parts.append("the other edges at target" if solution.held_edges else "at target")
            elif not wants_move:
                parts.append(f"holding: the move to the target ({biggest:.0%} of an edge's traffic "
                             f"at most) would neither lower latency nor relieve an origin")
            elif limited:
                parts.append("holding: a further relax step would risk overload")
            else:
                parts.append(f"holding: a step toward the target would be under the dead band "
                             f"({s.deadband:.1%})")
        if solution.status != "optimal":
            parts.append(solution.message)
        return "; ".join(parts)

