"""After a flap storm the origin came back only after the full back-off (up to
``hold_down_max_intervals``) and then the ``slowstart`` ramp: 6 + 4 intervals after it had
plainly stopped flapping, every move of that return outside the verdict's settling window
(churn, and the latency of the detour meanwhile; sim_kinds seed 52 #4: o1 at 0 % until 220 s,
back at 280 s). An up-spell twice as long as any of the storm's (and one interval longer, a spell
being seen to the tick) ends the hold-down: the whole capacity at once, filled at the fast relax.
One still flapping, regularly or not, never gets there."""

from __future__ import annotations

import numpy as np

from opsloop.controllers.edge.controller import EdgeController, Observation
from opsloop.controllers.edge.holddown import HoldDown
from opsloop.controllers.edge.settings import ControllerSettings
from tests.controllers.edge.drawn_cases import run_drawn

IV = 15.0


def _usable(hd: HoldDown, pattern: list[bool], start: float = 0.0) -> list[float]:
    """The flapper's usable fraction at each tick of ``pattern`` (its health), origin 1 always up."""
    out = []
    for k, up in enumerate(pattern):
        out.append(float(hd.update(start + IV * (k + 1), np.array([up, True]))[0]))
    return out


def test_a_flapper_that_stopped_gets_its_capacity_back_two_intervals_into_its_long_up_spell() -> None:
    hd = HoldDown(2, ControllerSettings(interval_s=IV))
    storm = [True] + [False, True] * 5          # up-spells of one interval
    usable = _usable(hd, storm + [True] * 12)
    assert all(u == 0.0 for u, up in zip(usable[1:len(storm)], storm[1:]) if up)   # the storm's: held down
    after = usable[len(storm):]                 # the last up was at len(storm) - 1
    # one interval into the up-spell it is as long as the storm's: still held; two: back at once
    assert after[0] == 0.0 and after[1:] == [1.0] * 11, after
    assert not hd.held(IV * (len(storm) + 2))[0]
    assert hd.settled(IV * (len(storm) + 2))[0]   # filled as fast as a settled origin


def test_a_still_flapping_origin_never_gets_traffic_back() -> None:
    # a back-off longer than the storm: only the end of the flapping can end the hold-down
    hd = HoldDown(2, ControllerSettings(interval_s=IV, hold_down_max_intervals=20))
    # up-spells of 1, 2, 3 and 1 intervals: each new record is still short of twice the longest
    storm = [True, False, True, False, True, True, False, True, True, True, False, True, False]
    usable = _usable(hd, storm)
    assert all(u == 0.0 for u, up in zip(usable[1:], storm[1:]) if up), usable
    # the next up-spell needs 2 × 3 intervals before it counts as the end of the storm
    after = _usable(hd, [True] * 8, start=IV * len(storm))
    assert after[:6] == [0.0] * 6 and after[6:] == [1.0] * 2, after


def test_a_first_flap_and_a_repair_keep_the_hold_down_and_the_ramp() -> None:
    """No earlier up-spell in the episode: nothing shows the flapping has stopped."""
    hd = HoldDown(2, ControllerSettings(interval_s=IV))
    usable = _usable(hd, [True, False] + [True] * 8)
    assert usable[2:] == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0], usable
    hd = HoldDown(2, ControllerSettings(interval_s=IV))
    usable = _usable(hd, [True] + [False] * 10 + [True] * 6)
    assert usable[11:] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0], usable


def test_the_controller_moves_traffic_home_once_the_storm_is_over() -> None:
    ctrl = EdgeController(1, 2, ControllerSettings(interval_s=IV), initial=np.array([[1.0, 0.0]]))
    shares = []
    for k, up in enumerate([True] + [False, True] * 4 + [True] * 4):
        d = ctrl.step(Observation(now=IV * (k + 1), demand=np.array([200.0]), capacity=np.array([400.0, 1000.0]),
                                  latency=np.array([[10.0, 80.0]]), healthy=np.array([up, True])))
        shares.append(float(d.weights[0, 0]))
    assert max(shares[1:10]) == 0.0, shares     # nothing back during the storm, nor one interval after
    assert shares[10] >= 0.5 and shares[12] > shares[10], shares


def test_flapping_52_4_returns_within_two_intervals_of_the_storm_seen_over() -> None:
    """o1 flips every 10 s from 90 s, last up at 160 s (seen at 170 s, 6 s detection delay)."""
    _, runs = run_drawn("flapping-52-4")
    run = runs["ours"]
    rates = run.rates[np.round(run.tick_times / 1.0).astype(int) - 1]

    def o1_share(t: float) -> float:
        k = int(np.flatnonzero(np.isclose(run.tick_times, t))[0])
        w = run.tick_weights[k + 1]
        return float((rates[k] @ w)[0] / rates[k].sum())

    assert all(o1_share(t) == 0.0 for t in range(100, 190, 10))
    assert o1_share(190.0) > 0.3 and o1_share(200.0) > 0.6, (o1_share(190.0), o1_share(200.0))
