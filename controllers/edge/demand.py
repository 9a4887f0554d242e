"""The demand model of :class:`~opsloop.controllers.edge.controller.EdgeController`: what each
edge's clients send, will send, and how their rate answers the latency our weights give them.

Step 1 of the control law (the controller's module docstring): every measurement is kept with the
latency its clients saw; from them :class:`DemandModel` reads the estimate a plan is made on (the
max of the last ``demand_window`` readings, a ramp's next interval, a step's extrapolated level),
the variability of the clients' own demand (σ of log-demand, peak-held) and the uplift that covers
its ``demand_quantile``, and the clients' elasticity across our own moves. It predicts what they
send at other weights: the worst case for a relax step (:meth:`DemandModel.predicted_demand_at`),
the rebound once relieved origins answer at unloaded speed (:meth:`DemandModel.relieved_demand`)
and the demand at a plan's own weights (:meth:`DemandModel.demand_at`). It holds no weights: the
controller passes the ones in force and the origins' response times.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import NormalDist

import numpy as np

from opsloop.controllers.edge.settings import ControllerSettings

_EPS = 1e-12
# an edge measured at or below this rate (req/s) is idle: its log-demand is no number to read a
# change from (log 0), and a change into or out of idleness is neither noise nor a ramp
IDLE_RPS = 1e-3
# σ of log-demand beyond this (a factor e per interval) is no noise to plan a mean level on: steps
# read as noise (a step from 50 to 1e9 req/s with no draws around it made σ 5, and the plan sat at
# the window's mean, a quarter below the demand, for five intervals)
MAX_NOISE_SIGMA = 1.0
# σ (the demand's own noise) is read off this many interval-to-interval changes; a ramp and a
# step are read only from then on (before, noisy draws read as either)
SIGMA_CHANGES = 5
# a big move: the latency an edge's clients see changes by more than 10 % (log) in an interval
_BIG_MOVE = 0.1


def big_moves(log_latency: np.ndarray) -> np.ndarray:
    """[T-1, E] from log latency [T, E]: the intervals in which an edge's latency moved by more
    than ``_BIG_MOVE`` — rates read across them say more about the clients' elasticity than
    about their demand."""
    return np.abs(np.diff(log_latency, axis=0)) > _BIG_MOVE


def mean_latency(weights: np.ndarray, latency: np.ndarray, service: np.ndarray | None,
                 floor_ms: float) -> np.ndarray:
    """Mean latency an edge's clients see at ``weights``: network + the origins' response
    time (``service`` [O] when observed, else the ``floor_ms`` allowance)."""
    finite = np.where(np.isfinite(latency), latency, 0.0)
    if service is None:
        return (weights * finite).sum(axis=1) + floor_ms
    return (weights * (finite + service[None, :])).sum(axis=1)


class DemandModel:
    """Per edge: the demand history with the latency each reading was taken at, and what it says
    (module docstring). The state a plan reads is public: ``sigma`` (per-interval noise of
    log-demand, peak-held), ``uplift`` (the plan's variability uplift at the last reading,
    rate-limited), ``rising`` (a ramp seen), ``step_seen``/``stepped`` (a step read at the last
    reading; ``stepped`` is cleared where the plan drops the step's extrapolation) and
    ``unstepped`` (the estimate without that extrapolation)."""

    def __init__(self, n_edges: int, settings: ControllerSettings) -> None:
        self.settings = s = settings
        self._demand_history: deque[np.ndarray] = deque(
            maxlen=max(s.demand_window, s.variability_window + 2, s.slow_ramp_readings, 4))
        self._latency_history: deque[np.ndarray] = deque(maxlen=self._demand_history.maxlen)
        # log network latency (+ unloaded response) at the weights in force: our own moves
        self._move_history: deque[np.ndarray] = deque(maxlen=self._demand_history.maxlen)
        self._scale = np.ones(n_edges)  # estimate / the window's largest measurement
        self.sigma = np.zeros(n_edges)  # per-interval noise of log-demand (peak-held)
        self.uplift = np.zeros(n_edges)  # the plan's uplift at the last tick (rate-limited)
        self.rising = np.zeros(n_edges, dtype=bool)  # a ramp seen at the last tick
        self.step_seen = np.zeros(n_edges, dtype=bool)  # a step read at the last tick
        # a step seen in the last interval's mean (its level extrapolated), and the estimate
        # without that extrapolation
        self.stepped = np.zeros(n_edges, dtype=bool)
        self.unstepped = np.zeros(n_edges)
        # the clients' elasticity as seen across our own big moves, per edge (latest few)
        self.elasticity_obs: list[deque[float]] = [deque(maxlen=5) for _ in range(n_edges)]
        # the same moves as (Δln latency, Δln rate) pairs, for what a plan may count on clients
        # moved farther to drop (:meth:`fall_elasticity`)
        self.fall_obs: list[deque[tuple[float, float]]] = [deque(maxlen=8) for _ in range(n_edges)]
        self._z = NormalDist().inv_cdf(s.demand_quantile)
        # per edge: the last reading of traffic that was served and the latency it was read at,
        # held over the intervals an edge's traffic failed (:meth:`update`'s ``unserved``)
        self._served: tuple[np.ndarray, np.ndarray] | None = None

    def update(self, measured: np.ndarray, row_latency: np.ndarray,
               unloaded_latency: np.ndarray | None, unserved: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(estimate, uplift, rising) per edge, from this interval's ``measured`` rates and the
        latency their clients saw (``row_latency``); ``unloaded_latency``: the latency of the
        weights in force at unloaded speed (our own move; None before the first weights).
        ``unserved``: edges that had no origin up during the interval — their requests failed
        and elastic clients backed off from the timeouts, so the reading is no demand at
        ``row_latency``: the edge's last served reading is held instead
        (read as one, every origin down for a few intervals read as demand falling to a sixth,
        and the recovery as a step up extrapolated 3x: the plan at recovery, 2.5x the demand,
        shed a third of the traffic onto far origins).

        The estimate is the max of the last ``demand_window`` measurements; on a ramp (three
        rises in a row, ``ramp_threshold`` per interval on average) plus one more interval of it;
        then times ``1 + uplift`` so that the plan covers the ``demand_quantile`` of the
        interval-to-interval variability beyond what the headroom already covers. The
        variability is read from second differences of log-demand, which a steady ramp and the
        geometric approach of our own relax steps leave near zero, and the median absolute
        deviation, which a single step (a surge, a shed) does not move."""
        s = self.settings
        if unserved is not None and self._served is not None:
            measured = np.where(unserved, self._served[0], measured)
            row_latency = np.where(unserved, self._served[1], row_latency)
        self._served = (np.array(measured, dtype=float), np.array(row_latency, dtype=float))
        self._demand_history.append(measured)
        self._latency_history.append(row_latency)
        self._move_history.append(
            np.log(np.maximum(unloaded_latency, _EPS)) if unloaded_latency is not None
            else np.full(len(measured), np.nan))
        hist = np.stack(self._demand_history)
        estimate = hist[-s.demand_window:].max(axis=0)
        uplift = np.zeros(len(measured))
        rising = np.zeros(len(measured), dtype=bool)
        # the clients' own demand: what they sent, corrected for the latency our weights gave
        # them (elastic clients send less on a slower mix), so our moves do not read as noise
        log_latency = np.log(np.maximum(np.stack(self._latency_history), _EPS))
        self._learn_elasticity(hist, log_latency)
        logs = np.log(np.maximum(hist, 1e-9)) + s.elasticity * log_latency
        changes = np.diff(logs, axis=0)
        # a big move (> 10 % latency) says more about the clients' elasticity than about their
        # demand: such intervals are left out, as are those into or out of an idle spell (read
        # as a change of ±20 in log-demand, σ ran to ~8 and the plan sat at the idle spell's
        # mean while the demand came back at 200 % of an origin)
        idle = hist <= IDLE_RPS
        idle_change = idle[1:] | idle[:-1]
        big_move = big_moves(log_latency) | idle_change
        changes[big_move] = np.nan
        # σ: the per-interval noise of log-demand, from the median absolute deviation of second
        # differences (var = 6σ² for white noise; a step or a steady ramp leaves it alone)
        sigma = np.zeros(len(measured))
        # a demand step (a change beyond 25 % and 4σ, the next interval moving the same way by
        # less than half: the clients' lag carrying it on) is no noise, nor is that lag: with
        # few draws between our moves, the pair (-0.47, -0.12 after a step back to base demand)
        # read as σ 5 %, and the plan went on the noisy window's level (a mix of draws from
        # before our relax steps) and overfilled an origin. A noisy draw is taken back; and
        # before σ was first read (a few draws) no change is told from noise
        c = np.nan_to_num(changes)
        bar = np.where(self.sigma > 0, np.maximum(0.25, 4.0 * self.sigma), np.inf)
        steps = np.zeros(changes.shape, dtype=bool)
        steps[:-1] = (np.abs(c[:-1]) > bar[None, :]) & (
            np.sign(c[1:]) == np.sign(c[:-1])) & (np.abs(c[1:]) < 0.5 * np.abs(c[:-1]))
        steps[1:] |= steps[:-1].copy()
        for_sigma = np.where(steps, np.nan, changes)
        if len(changes) >= SIGMA_CHANGES:
            second = np.diff(for_sigma, axis=0)
            valid = (~np.isnan(second)).sum(axis=0) >= 4
            if valid.any():
                part = second[:, valid]
                mad = np.nanmedian(np.abs(part - np.nanmedian(part, axis=0)), axis=0)
                sigma[valid] = 1.4826 * mad / math.sqrt(6.0)
            # variability is a lasting property of the demand, and a few calm draws (or moves
            # of ours left out) must not drop the headroom at once: it rises at once, decays
            # slowly (half-life ~13 intervals)
            sigma = np.maximum(sigma, self.sigma * 0.95)
            self.sigma = sigma
        # a ramp is read only once σ is known, as a step is: before, its bar is the
        # measurement-noise floor, and on ±20 % demand three rising draws made a ramp whose
        # room shed a quarter of an edge onto a far origin for eight intervals (noise 43 #4)
        if s.anticipate_ramp and len(changes) >= SIGMA_CHANGES:
            # a ramp rises three times running, by more than the threshold and clearly more than
            # the noise (the mean of three rises has sd √2·σ/3: 2.5 of those); one more interval
            # of its mean rise is added, or of the latest when that is under a third of the
            # mean: a step (a big rise, the clients' transient, then nothing) is no ramp
            # an interval of a big move of ours still shows a ramp (an edge moved in a shed
            # must not lose its ramp while the others keep theirs): the rise counted is the
            # smaller of the raw one and the one corrected with the elasticity seen across our
            # moves, so neither a shed's drop nor a relief's rebound reads as a ramp
            raw_logs = np.log(np.maximum(hist, 1e-9))
            seen = np.minimum(np.diff(raw_logs, axis=0), np.diff(
                raw_logs + self.elasticity_seen() * log_latency, axis=0))
            seen[idle_change] = np.nan   # no rise to read from an idle reading
            filled = np.isnan(changes[-3:])
            last3 = np.where(filled, seen[-3:], changes[-3:])
            # a filled interval may hold a step of demand (it slowed the origins): when it is
            # the largest rise by more than 3x the others', it is a step, not a ramp
            cols = np.arange(last3.shape[1])
            steady3 = ~(filled[last3.argmax(axis=0), cols]
                        & (last3.max(axis=0) > 3.0 * np.median(last3, axis=0)))
            steady2 = ~(filled[1:][last3[-2:].argmax(axis=0), cols]
                        & (last3[-2:].max(axis=0) > 3.0 * last3[-2:].min(axis=0)))
            mean_change = last3.mean(axis=0)
            # a step in the last interval after two calm ones (within 2 sd of one interval's
            # change) is no ramp whatever the signs of the calm two: the step rule takes it
            change_sd = self._change_sd(sigma)
            step_shape = (np.abs(last3[:2]) <= 2.0 * change_sd).all(axis=0) \
                & (last3[-1] > s.step_sigmas * change_sd)
            # the rise after a step read at the last tick is that step's remainder (it came late
            # in the interval, the clients took a while to reach it), not a third rise of a
            # ramp: read as one, a shortfall step ran the plan 47 % above the demand that came
            # and overfilled the far origins; a ramp that goes on rising is read a tick later
            # (σ at least the measurement-noise floor: read off a few draws it runs low, and
            # three noisy draws on one edge then made a ramp that moved its weights)
            rising = (last3 > 0).all(axis=0) & (mean_change > s.ramp_threshold) \
                & (mean_change > 2.5 * change_sd / 3.0) \
                & steady3 & ~step_shape & ~self.step_seen
            mean_rise, last_rise = (hist[-1] - hist[-4]) / 3, hist[-1] - hist[-2]
            # the clients' own rise: raw rises over intervals of our sheds (traffic moved
            # farther, elastic clients slowing) understate the ramp; only for demand the
            # headroom's noise allowance covers (on noisy demand our moves follow draws, and the
            # correction amplifies them)
            own = np.diff(raw_logs + self.elasticity_seen() * log_latency, axis=0)[-3:].mean(axis=0)
            quiet = self.uplift <= s.noisy_uplift
            mean_rise = np.where(quiet, np.maximum(mean_rise, hist[-1] * np.expm1(own)), mean_rise)
            slope = np.where(last3[-1] >= mean_change / 3, mean_rise,
                             np.minimum(mean_rise, last_rise))
            # a fast ramp is over before it rose three times: two steady rises, each well above
            # the threshold and the noise, already make one
            last2 = last3[-2:]
            fast = (last2.min(axis=0) > 2.0 * s.ramp_threshold) \
                & (last2.min(axis=0) > 3.0 * sigma) & (last2[-1] >= last2[0] / 2) & steady2 & ~rising
            slope = np.where(fast, np.minimum((hist[-1] - hist[-3]) / 2, last_rise), slope)
            rising |= fast
            # a ramp common to the edges (a daily rise, a listener-wide surge): an edge's own
            # rises may hide in its measurement noise, their median across edges does not
            # (its noise is ~1/√E of an edge's), and one edge surging leaves the median flat.
            # Two such rises lift every edge not clearly falling by the common rise
            if last3.shape[1] >= 3:
                common = np.median(last3[-2:], axis=1)
                common_sigma = 1.2533 * float(np.median(sigma)) / math.sqrt(last3.shape[1])
                if (common.min() > 2.0 * s.ramp_threshold and common.min() > 3.0 * common_sigma
                        and common[-1] >= common[0] / 2):
                    common_rise = float(common.mean())  # per interval (log); 0: no common ramp
                else:
                    # a slower common ramp: the edges' mean rises over the last three intervals,
                    # the largest left out (one edge surging must not carry the others), their
                    # median above the threshold and 3 sd of its noise, σ at least the
                    # measurement-noise floor (σ read off a few early draws runs low, and noise
                    # then reads as a ramp); the median rise of each interval positive and none
                    # a step (> 3x their median); slower still: the trend over more readings
                    med = np.median(last3, axis=1)
                    rest = np.sort(last3.mean(axis=0))[:-1]
                    mean3 = float(np.median(rest))
                    noise3 = math.sqrt(2.0) / 3.0 * 1.2533 * max(
                        float(np.median(sigma)), s.ramp_noise_floor) / math.sqrt(len(rest))
                    if (mean3 > s.ramp_threshold and mean3 > 3.0 * noise3 and (med > 0).all()
                            and med.max() < 3.0 * float(np.median(med))):
                        common_rise = mean3
                    else:
                        common_rise = self._slow_common_ramp(changes, seen)
                ramp_rise = np.full(last3.shape[1], common_rise)  # 0: no common ramp
            else:
                # one or two edges: no common ramp to read across them, each edge's own trend
                ramp_rise = self._slow_own_ramps(changes, seen, change_sd)
            # the ramp read, common or the edge's own, lifts every edge not clearly falling
            lifted = ~rising & (ramp_rise > 0) & (last3[-1] > -3.0 * sigma)
            slope = np.where(lifted, np.expm1(ramp_rise) * hist[-1], slope)
            rising |= lifted
            # a ramp still rising stays one (hysteresis): a relax step must not undo the room
            # made for it because one rise fell under the bar
            going_on = self.rising & ~rising & (last3[-1] > 0)
            slope = np.where(going_on, np.clip(last_rise, 0.0, None), slope)
            rising |= going_on
            # a rise too small to matter is no ramp (it must not trigger an early joint move)
            rising &= slope > 0.5 * s.ramp_threshold * np.maximum(hist[-1], _EPS)
            # the measurement is the last interval's mean (its middle); the plan must hold to
            # the end of the next interval, 1.5 intervals of the ramp ahead: one is added, the
            # rest left to the headroom (all 1.5 only moved the overload between draws)
            estimate = estimate + np.where(rising, slope, 0.0)
        was_rising, self.rising = self.rising, rising
        plain = estimate
        estimate, stepped = self._step_level(hist, logs, changes, sigma, estimate, rising,
                                             was_rising)
        if len(changes) >= SIGMA_CHANGES:
            uplift = np.clip(self._z * sigma - s.headroom, 0.0, s.max_uplift)
            # σ read off a few draws jumps (0.008 early, 0.15 late for a true 0.10): the uplift
            # follows it by at most uplift_rate per interval, so one jump of the estimate does
            # not swing the weights; a real overload is still shed on the measured load
            uplift = np.clip(uplift, self.uplift - s.uplift_rate, self.uplift + s.uplift_rate)
            self.uplift = uplift
            # noisy demand (the quantile needs more than the headroom): plan on the window's
            # mean level, so the weights do not chase every draw; a rise beyond 3σ of that level
            # is a step, not noise, and the max of the last measurements stays in charge
            noisy = (uplift > s.noisy_uplift) & (sigma <= MAX_NOISE_SIGMA)
            level = self._level_since_a_big_move(hist, big_move)
            # (at most twice the level: noise so large that a doubling hides in it is no noise
            # to plan a mean on)
            step = hist[-1] > level * (1.0 + np.minimum(3.0 * sigma, 1.0))
            calm_estimate = np.maximum(level, estimate - hist[-s.demand_window:].max(axis=0)
                                       + level)  # keeps the ramp's slope
            estimate = np.where(noisy & ~step & ~rising & ~stepped, calm_estimate, estimate)
            plain = np.where(noisy & ~step & ~rising, calm_estimate, plain)
        self.unstepped = plain * (1.0 + uplift)
        return estimate * (1.0 + uplift), uplift, rising

    def predicted_demand_at(self, weights: np.ndarray, latency: np.ndarray,
                            service_base: np.ndarray | None,
                            elasticity: np.ndarray | float | None = None) -> np.ndarray:
        """Worst-case demand at ``weights``: each of the last ``demand_window`` measurements
        grows from the latency its clients saw then to the latency at ``weights`` (relieved
        origins answering at their unloaded speed), never assumed to fall; the largest, times
        the estimate's ramp/variability factor. Each measurement is taken from its own latency,
        so one move's worst case does not compound with the next one's. ``service_base``: the
        origins' unloaded response times (None: not observed). ``elasticity``: the clients'
        (default: the worst case assumed, ``settings.elasticity``)."""
        new = mean_latency(weights, latency, service_base, self.settings.latency_floor_ms)
        window = self.settings.demand_window
        samples = np.stack(list(self._demand_history)[-window:])
        seen = np.stack(list(self._latency_history)[-window:])
        growth = np.maximum(1.0, seen / np.maximum(new, _EPS)[None, :])
        eps = self.settings.elasticity if elasticity is None else elasticity
        return self._scale * (samples * growth ** eps).max(axis=0)

    def demand_at(self, weights: np.ndarray, latency: np.ndarray, service: np.ndarray | None,
                  loaded: bool = False) -> np.ndarray:
        """Demand at ``weights`` with the origins answering in ``service`` [O]: each of the last
        ``demand_window`` measurements taken from the latency its clients saw to the latency at
        ``weights`` (a rise with the elasticity seen across our own moves); the largest, times the
        estimate's ramp/variability factor. A fall: as far as the fit over our moves shows
        (:meth:`fall_elasticity`); with ``loaded`` (a shortfall: the origins stay loaded), as far
        as the largest elasticity seen (none until one was: demand that stays is the worst case)."""
        new = mean_latency(weights, latency, service, self.settings.latency_floor_ms)
        window = self.settings.demand_window
        samples = np.stack(list(self._demand_history)[-window:])
        seen = np.stack(list(self._latency_history)[-window:])
        # a round trip is at least 1 ms (0 ms paths answered in 0 ms made the ratio unbounded)
        growth = np.maximum(seen, 1.0) / np.maximum(new, 1.0)[None, :]
        # a rise with the elasticity seen (the worst case until one was); a fall only as far as
        # one was seen (none until then: the worst case for a shortfall is demand that stays)
        if loaded:
            seen_fall = np.array([max(o) if o else 0.0 for o in self.elasticity_obs])
        else:
            seen_fall = self.fall_elasticity()
        eps = np.where(growth >= 1.0, self.elasticity_seen()[None, :], seen_fall[None, :])
        return self._scale * (samples * growth ** eps).max(axis=0)

    def relieved_demand(self) -> np.ndarray:
        """Per edge: the demand at the weights of each recent measurement were every origin
        answering at its unloaded speed (rebound after a shed), the largest, times the
        estimate's ramp/variability factor. Without origin response times: the estimate."""
        window = self.settings.demand_window
        samples = np.stack(list(self._demand_history)[-window:])
        seen = np.stack(list(self._latency_history)[-window:])
        unloaded = np.exp(np.stack(list(self._move_history)[-window:]))
        growth = np.where(np.isfinite(unloaded), np.maximum(1.0, seen / np.maximum(
            np.nan_to_num(unloaded, nan=1.0), _EPS)), 1.0)
        # a step's extrapolation is already the worst case of the part of the interval it was
        # seen in: the rebound of the clients it slowed is not compounded on it (the plan takes
        # the larger of the two, _plan's max)
        scale = np.where(self.stepped, self.factor_over_window(self.unstepped), self._scale)
        return scale * (samples * growth ** self.elasticity_seen()[None, :]).max(axis=0)

    def elasticity_seen(self) -> np.ndarray:
        """Per edge: the largest elasticity seen across our own big moves, the worst case assumed
        (``settings.elasticity``) until one was seen. Used to plan targets and for how far a
        shed at the normal headroom moves an edge nearer (the overload it relieves is certain):
        the relax step and the overload check keep the worst case, so a low reading costs
        speed, not safety."""
        worst = self.settings.elasticity
        return np.array([max(o) if o else worst for o in self.elasticity_obs])

    def _learn_elasticity(self, hist: np.ndarray, log_latency: np.ndarray) -> None:
        """A move of ours that changed an edge's latency by more than 10 % between two intervals
        shows how its clients' rate answers latency: −Δln(rate)/Δln(latency), up to the worst
        case. Only our moves count (an overloaded origin slowing down comes with a demand rise),
        and a rate that moved with the latency (a demand change at the same time) says nothing."""
        moves = self._move_history
        if len(hist) < 2 or len(moves) < 2 or np.isnan(moves[-2]).any():
            return
        ours = moves[-1] - moves[-2]
        d_lat = log_latency[-1] - log_latency[-2]
        log_rate = np.log(np.maximum(hist, 1e-9))
        d_rate = log_rate[-1] - log_rate[-2]
        # a demand step still settling when we moved (the interval before rose or fell by more
        # than 10 % and 3σ with no move of ours) carries on into the move's interval: a step
        # up read as clients barely slowed by a shed (0.44 for closed-loop ones, and the
        # shortfall plan then put that edge back on its near origin, overloading it by 68 %)
        # for the fall's fit: the rate against the level of the three intervals before, not
        # the last one alone: we shed on a high reading, and noise's next draw falling back
        # from it read as clients slowing down (0.6 on open-loop demand)
        level_change = log_rate[-1] - log_rate[-4:-1].mean(axis=0)
        settling = np.zeros(len(hist[-1]), dtype=bool)
        if len(hist) >= 3:
            settling = (np.abs(log_latency[-2] - log_latency[-3]) <= _BIG_MOVE) & (
                np.abs(log_rate[-2] - log_rate[-3]) > np.maximum(0.1, 3.0 * self.sigma))
        idle = (hist[-2:] <= IDLE_RPS).any(axis=0)   # a rate from or to 0 answers no latency
        for e in np.flatnonzero((np.abs(ours) > _BIG_MOVE) & (np.sign(ours) == np.sign(d_lat))
                                & ~settling & ~idle):
            seen = -d_rate[e] / d_lat[e]
            if seen >= 0:
                self.elasticity_obs[e].append(float(min(seen, self.settings.elasticity)))
            if len(hist) >= 4:
                self.fall_obs[e].append((float(d_lat[e]), float(level_change[e])))

    def fall_elasticity(self) -> np.ndarray:
        """Per edge: how far a plan may count on clients moved to slower origins sending less.
        The elasticity fitted over all our moves (−ΣΔlnL·Δlnr / ΣΔlnL², Δlnr against the level of
        the three intervals before the move) less two standard errors (that change carries
        √(4/3) σ of demand noise, σ at least 2 %), at least 0. On noisy
        open-loop demand single readings scatter around 0, and the largest (0.6) had a shed
        plan leave the origin over capacity; closed-loop clients with little noise read ~1."""
        out = np.zeros(len(self.fall_obs))
        for e, pairs in enumerate(self.fall_obs):
            if not pairs:
                continue
            d_lat = np.array([p[0] for p in pairs])
            d_rate = np.array([p[1] for p in pairs])
            spread = float((d_lat ** 2).sum())
            fitted = -float((d_lat * d_rate).sum()) / spread
            se = math.sqrt(4.0 / 3.0) * max(float(self.sigma[e]), 0.02) / math.sqrt(spread)
            out[e] = float(np.clip(fitted - 2.0 * se, 0.0, self.settings.elasticity))
        return out

    def unstep(self, edges: np.ndarray, estimate: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """``estimate`` with ``edges`` planned on the level measured (times ``scale``), not on
        their step's extrapolation: the plan's scale follows."""
        self.stepped = self.stepped & ~edges
        estimate = np.where(edges, self.unstepped * scale, estimate)
        self.set_scale(estimate)
        return estimate

    def set_scale(self, estimate: np.ndarray) -> None:
        """The ramp/step/variability factor of ``estimate`` over the window's largest
        measurement: the predictions from each measurement's own latency carry it."""
        self._scale = self.factor_over_window(estimate)

    def factor_over_window(self, level: np.ndarray) -> np.ndarray:
        """Per edge: ``level`` over the largest measurement of the window (1 where none)."""
        raw = np.stack(list(self._demand_history)[-self.settings.demand_window:]).max(axis=0)
        return np.divide(level, raw, out=np.ones_like(level), where=raw > _EPS)

    def _level_since_a_big_move(self, hist: np.ndarray, big_move: np.ndarray) -> np.ndarray:
        """Per edge: the mean of the last ``variability_window`` measurements, only of those
        taken since the latency its clients saw last changed by more than 10 % (``big_move``,
        :func:`big_moves`: the intervals σ leaves out, a big move of ours or an origin slowed
        down by overload); the last one alone when that was the last interval. Elastic clients
        send another rate at another latency: an edge moved off a failed 6 ms origin onto 60-75
        ms ones sent a quarter of its rate, and the window's mean over both planned it at twice
        what it sent (its nearest origin read 126 % full while at 91 %: a shed, relax steps
        back, 8 points of weight swinging every few intervals)."""
        n = min(self.settings.variability_window, len(hist))
        window, moved = hist[-n:], big_move[len(big_move) - (n - 1):]  # the moves between them
        # the first reading after the last such change in the window (0: none in it)
        first = np.where(moved.any(axis=0), n - 1 - np.argmax(moved[::-1], axis=0), 0)
        keep = np.arange(n)[:, None] >= first[None, :]
        return (window * keep).sum(axis=0) / keep.sum(axis=0)

    def _change_sd(self, sigma: np.ndarray) -> np.ndarray:
        """The sd of one interval's change of an edge's log-demand: σ√2, σ at least
        ``ramp_noise_floor`` (σ read off a few draws runs low)."""
        return math.sqrt(2.0) * np.maximum(sigma, self.settings.ramp_noise_floor)

    def _slow_common_ramp(self, changes: np.ndarray, seen: np.ndarray) -> float:
        """The rise per interval (log) of a ramp common to the edges too slow for the three-interval
        tests, else 0: the least-squares slope of the edges' mean level over the last
        ``slow_ramp_readings`` readings (the edge rising most left out: one edge surging must not
        carry the others), above ``ramp_threshold`` and ``slow_ramp_t`` standard errors of the
        fit's own residuals — not σ, which is held at its peak: a daily peak rising 2 % an
        interval under 2-4 % measurement noise cleared neither the 3-interval bar nor one built on
        σ, and the origins ran into capacity before anything moved. A step fits the window as a
        level shift: when one explains it twice as well as the line, it is a step, not a ramp."""
        levels = self._ramp_levels(changes, seen)  # called with three edges or more
        if levels is None:
            return 0.0
        return self._trend(levels[:, np.argsort(levels[-1])[:-1]].mean(axis=1))

    def _slow_own_ramps(self, changes: np.ndarray, seen: np.ndarray,
                        change_sd: np.ndarray) -> np.ndarray:
        """Per edge: the rise per interval (log) of its own slow ramp, as :meth:`_slow_common_ramp`
        on its own level (0: none, or too few readings). With one or two edges there is no
        common level to read: two edges' peak rising 3 % an interval under 2.5 % measurement
        noise ran an origin over capacity for 34 s before the 3-interval tests saw it. An edge
        with a change in the window beyond ``step_sigmas`` × ``change_sd`` (one interval's change,
        :meth:`_change_sd`) is on a surge, the step's business: a slow slope read across it held
        the surge's plan low."""
        levels = self._ramp_levels(changes, seen)
        if levels is None:
            return np.zeros(changes.shape[1])
        calm = (np.diff(levels, axis=0) <= self.settings.step_sigmas * change_sd).all(axis=0)
        return np.array([self._trend(levels[:, e]) if calm[e] else 0.0
                         for e in range(levels.shape[1])])

    def _ramp_levels(self, changes: np.ndarray, seen: np.ndarray) -> np.ndarray | None:
        """Each edge's log-demand level over the last ``slow_ramp_readings`` readings (0 at the
        first), None with fewer. Intervals of a big move of ours count with the smaller of the
        raw and corrected rise (``seen``)."""
        n = self.settings.slow_ramp_readings - 1  # changes in the window
        if len(changes) < n:
            return None
        window = np.where(np.isnan(changes[-n:]), seen[-n:], changes[-n:])
        return np.vstack([np.zeros(window.shape[1]), np.cumsum(window, axis=0)])

    def _trend(self, level: np.ndarray) -> float:
        """The least-squares slope of ``level`` when it clears ``ramp_threshold`` and
        ``slow_ramp_t`` standard errors and a level shift does not fit twice as well, else 0."""
        s = self.settings
        # the straight-line fit by hand: np.polyfit(cov=True) scales its covariance by N − 1
        # for a line (N − 3 in older numpy), not the N − 2 of the slope's standard error
        x = np.arange(len(level), dtype=float) - (len(level) - 1) / 2.0
        slope = float((x * level).sum() / (x * x).sum())
        rss_line = float(((level - level.mean() - slope * x) ** 2).sum())
        se = math.sqrt(rss_line / (len(x) - 2) / float((x * x).sum()))
        rss_step = min(float(((level[:k] - level[:k].mean()) ** 2).sum()
                             + ((level[k:] - level[k:].mean()) ** 2).sum())
                       for k in range(1, len(level)))
        if slope > s.ramp_threshold and slope > s.slow_ramp_t * max(se, 1e-4) \
                and rss_line < 2.0 * rss_step:
            return slope
        return 0.0

    def _step_level(self, hist: np.ndarray, logs: np.ndarray, changes: np.ndarray,
                    sigma: np.ndarray, estimate: np.ndarray, rising: np.ndarray,
                    was_rising: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(estimate, stepped): an edge whose demand rose as a *step* in the last interval is
        planned on ``prev + step_extrapolation × rise``. The measurement is the interval's mean:
        a step that came mid-interval shows about half its rise there (less, as the clients take
        a while to reach it), and the origins carry the whole of it until the next tick. A step:
        a rise over the level of the 3 intervals before (log-demand corrected for the latency our
        weights gave; not over a big move of ours, but over one the step made itself: an origin
        it overloaded slowed down, and a surge landing late in an interval was otherwise read
        in part and shed twice) beyond ``step_sigmas`` sd of one interval's
        change (σ√2, σ at least ``ramp_noise_floor``; the level's own noise is less), after two
        calm intervals (each within 2 sd), not on a ramp, and only once σ is known (a few early
        noisy draws read as steps). A step common to every edge (a listener-wide flash crowd) is
        judged on their mean rise, whose noise is 1/√E of one edge's: a step landing late in the
        interval shows there before it clears one edge's bar (their median above 1 sd and none
        below -1 sd, the mean above ``common_step_sigmas`` sd of its own noise, σ√(4/3)/√E),
        after two intervals calm on each edge (within 3 sd) and in their mean (within 2 sd of it
        and under a quarter of the last rise: by its second or third interval a common ramp
        stands as far above the level) and with no ramp seen at the last tick (read as a step, a
        ramp had the plan relax back the tick after while it went on). The next tick measures
        the full level: a step that came at the interval's start shows no further rise, and the
        plan relaxes back."""
        s = self.settings
        stepped = np.zeros(len(estimate), dtype=bool)
        if s.step_extrapolation > 1.0 and len(changes) >= SIGMA_CHANGES:
            change_sd = self._change_sd(sigma)
            rise = logs[-1] - logs[-4:-1].mean(axis=0)
            with np.errstate(invalid="ignore"):  # NaN: an interval of a big move of ours
                # judged against a calm level: the two intervals before moved within 2 sd
                # (not a ramp under way, a flap's dip and recovery, or a big move of ours)
                def calm_within(sds: float) -> np.ndarray:
                    return (np.abs(changes[-3:-1]) <= sds * change_sd).all(axis=0)
                # a big latency change our weights did not make (the step overloaded its
                # origins, which slowed down) leaves the step readable
                moves = np.stack(list(self._move_history)[-2:])   # NaN: no weights yet
                not_ours = np.isfinite(moves).all(axis=0) & ~big_moves(moves)[-1]
                unread = (~np.isnan(changes[-1]) | not_ours) & ~self.stepped
                fresh = unread & calm_within(2.0)
                stepped = fresh & (rise > s.step_sigmas * change_sd) & ~rising
                # the common step (docstring)
                edge_sd = float(np.median(change_sd))
                common_sd = edge_sd / math.sqrt(len(rise))
                before = changes[-3:-1].mean(axis=1)
                # their mean rise over the level: noise sd σ√(1 + 1/3) per edge (one reading
                # against the mean of three), not one interval's change σ√2; 1/√E for E edges
                rise_sd = common_sd * math.sqrt(2.0 / 3.0)
                listener_wide = float(np.median(rise)) > edge_sd and bool((rise > -change_sd).all())
                # each edge calm within 3 sd (asked within 2 sd, four edges' two intervals
                # each failed a third of calm readings), their mean within 2 sd below
                settled = unread & calm_within(3.0)
                if len(rise) >= 2 and settled.all() and listener_wide and not was_rising.any() \
                        and (np.abs(before) <= 2.0 * common_sd).all() \
                        and (before <= 0.25 * changes[-1].mean()).all() \
                        and rise.mean() > s.common_step_sigmas * rise_sd:
                    stepped = settled
            prev = hist[-4:-1].mean(axis=0)
            stepped &= hist[-1] > prev
            level = prev + s.step_extrapolation * (hist[-1] - prev)
            estimate = np.where(stepped, np.maximum(estimate, level), estimate)
        self.stepped = self.step_seen = stepped
        return estimate, stepped
