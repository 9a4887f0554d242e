"""In a shortfall every origin stays overloaded at the common factor: none is relieved to its
unloaded speed, so clients moved off a slowed origin onto a farther one may be planned to send
less (as far as their elasticity was seen across our moves), like everywhere else. Held at
their rate because their origin was slowed, the plan filled the far origins a little more each
interval. A draw of ``bench.sim_kinds`` (testdata/, the file says which)."""

from __future__ import annotations

import numpy as np

from tests.controllers.edge.drawn_cases import run_meeting_targets


def test_a_shortfall_on_slowing_origins_reaches_the_common_factor_in_three_intervals():
    # four closed-loop edges on four origins that slow down steeply under overload (1.9), demand
    # x2.14 at 70 s (107 % of all capacity), 10 s intervals: held at their rate, the edges moved
    # to the far origins left them under the common factor for four intervals (40 s to get
    # every origin within it + 5 %, 41 judged overload-seconds against the headroom baseline's
    # 376); counted to slow down as seen, within three intervals and under a tenth of it
    run = run_meeting_targets("shortfall-71-4")
    ratio = run.loads / run.capacity
    common = np.maximum(1.0, run.loads.sum(axis=1) / run.capacity.sum(axis=1))
    settled = (run.times > 110) & (run.times <= 200)
    assert (ratio[settled] <= common[settled, None] * 1.05 + 1e-9).all()


def test_clients_of_an_origin_relieved_from_a_deeper_overload_are_planned_to_send_more():
    # two elastic edges on one big origin (o1 634 req/s; o2, o3 190 each), demand x4.06 at 169 s
    # (132 % of all capacity), service time x(1 + 1.27 x overload): shed from 162 % to the common
    # factor (131 %), o1 answers faster and its clients send 12 % more than their reading under
    # the deeper overload. Planned at that reading, o1 stayed at 141 % for an interval (28
    # judged overload-seconds against 25.5 allowed); planned at the speed it will answer at, in
    # proportion between its unloaded speed and the one read, within 5 % of the others
    run = run_meeting_targets("shortfall-41-3")
    ratio = run.loads / run.capacity
    common = run.loads.sum(axis=1) / run.capacity.sum(axis=1)
    settled = (run.times > 215) & (run.times <= 430)
    assert (ratio[settled] <= common[settled, None] * 1.05 + 1e-9).all()
