"""Making room ahead of a ramp when every near origin is above its plan: the joint plan's chain
of moves (an edge off its near origin onto a second one, whose own edge leaves for a far one) is
taken as it is when it leaves the most loaded origin lower than the move with no gain on an
origin above its plan, which stood still. A draw of ``bench.sim_kinds`` (testdata/, the file
says which)."""

from __future__ import annotations

from tests.controllers.edge.drawn_cases import run_meeting_targets


def test_a_mesh_ramping_to_peak_makes_room_along_a_chain_of_moves():
    # three edges on four origins, demand x1.31 over 180 s to 86 % of all capacity, the three
    # near origins each above their plan while the far one has room: with gains on origins above
    # their plan cut, the edge on o2 could not move to o1/o3, o2 ran 1 % over for 6 s, where
    # the fixed-step baseline with our headroom had 16 s (the criterion: at most a tenth)
    run = run_meeting_targets("mesh-41-1")
    ramp = (run.times > 120) & (run.times <= 425)
    assert (run.loads[ramp] <= run.capacity[ramp] * (1 + 1e-9)).all()
