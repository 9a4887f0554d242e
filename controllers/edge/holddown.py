"""Hold-down for returning origins: Envoy's outlier-ejection back-off and HAProxy's ``slowstart``.

An origin that comes back healthy is planned as absent for ``hold_down_intervals`` ×
``hold_down_backoff``^(flaps−1) intervals (at most ``hold_down_max_intervals``; the flap count is
forgotten after that long without a change), then its capacity ramps in over
``slowstart_intervals``. Back after a long outage (a repair, not a flap) it is held for at most
``outage_hold_down_intervals``.

A flapping origin whose current up-spell outlasts twice its longest earlier up-spell of the
episode (and that by an interval at least: a spell is only seen to the tick) has stopped
flapping: it gets its whole capacity back at once, and may be filled as fast as a settled
origin, so the return ends within a step's settling allowance instead of after the full back-off
and ramp. One still flapping never gets that far: every earlier spell was shorter.
"""

from __future__ import annotations

import math

import numpy as np

from opsloop.controllers.edge.settings import ControllerSettings


class HoldDown:
    """Per-origin flap tracking: a returning origin earns traffic back only after it stays healthy
    (hold-down, doubling with every flap, like Envoy's outlier-ejection back-off) and then ramps
    in (HAProxy ``slowstart``). :meth:`update` gives each origin's usable fraction of capacity."""

    def __init__(self, n_origins: int, settings: ControllerSettings) -> None:
        self.s = settings
        self.up: np.ndarray | None = None
        self.flaps = np.zeros(n_origins, dtype=int)
        self.until = np.full(n_origins, -math.inf)      # hold-down ends
        self.changed_at = np.full(n_origins, -math.inf)  # last health change seen
        self.longest_up = np.zeros(n_origins)   # longest up-spell of the flap episode (s)
        self.stable = np.zeros(n_origins, dtype=bool)   # back, and has stopped flapping

    def update(self, now: float, healthy: np.ndarray) -> np.ndarray:
        s, interval = self.s, self.s.interval_s
        if self.up is None:  # the first view is the starting state, not a recovery
            self.up = healthy.copy()
            return np.ones(len(healthy))
        back = healthy & ~self.up
        gone = ~healthy & self.up
        moved = back | gone
        # an origin that stayed put for the longest hold-down has its flaps forgotten: one back
        # after that long down (a repair), and one that served that long before it went down
        # (Envoy lowers its ejection multiplier while a host stays healthy): its next return is
        # a first flap, not the back-off of flaps long past
        quiet = now - self.changed_at > s.hold_down_max_intervals * interval
        self.flaps[(back | gone) & quiet] = 0
        self.longest_up[(back | gone) & quiet] = 0.0
        spell = now - self.changed_at
        self.longest_up = np.where(gone & ~quiet, np.maximum(self.longest_up, spell), self.longest_up)
        self.stable[moved] = False
        self.flaps[back] += 1
        hold = np.minimum(s.hold_down_intervals * s.hold_down_backoff ** (self.flaps - 1),
                          s.hold_down_max_intervals) * interval
        # back after a long outage (a repair, not a flap): every interval it is held down moves
        # its whole share back later, outside the return's own transient
        hold = np.where(quiet, np.minimum(hold, s.outage_hold_down_intervals * interval), hold)
        self.until[back] = now + hold[back]
        self.changed_at[moved] = now
        self.up = healthy.copy()
        # up, with earlier up-spells in the episode, and longer than all of them by the margin:
        # the back-off and the ramp-in only delay a return that is no longer a flap
        done = healthy & ~moved & (self.longest_up > 0) & \
            (now - self.changed_at >= np.maximum(2.0 * self.longest_up, self.longest_up + interval) - 1e-9)
        self.stable |= done
        self.until = np.where(done, np.minimum(self.until, now), self.until)
        ramp_s = s.slowstart_intervals * interval
        # the first tick after the hold-down already gets one interval's worth of the ramp
        ramp = np.ones(len(healthy)) if ramp_s <= 0 else \
            np.clip((now - self.until + interval) / ramp_s, 0.0, 1.0)
        return np.where(self.stable, 1.0, np.where(now < self.until - 1e-9, 0.0, ramp))

    def held(self, now: float) -> np.ndarray:
        return now < self.until - 1e-9

    def settled(self, now: float) -> np.ndarray:
        """Origins whose health has not changed for twice the longest hold-down and ramp-in, or
        that are up and have stopped flapping: any other returning origin earns traffic at the
        relax step, never in a fast relax."""
        quiet = 2.0 * (self.s.hold_down_max_intervals + self.s.slowstart_intervals) * self.s.interval_s
        return (now - self.changed_at > quiet) | (self.stable & (self.up if self.up is not None else False))

