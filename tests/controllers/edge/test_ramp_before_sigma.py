"""A ramp is read only once the demand's own noise (σ) is known, as a step is: before, the bar a ramp
must clear is the measurement-noise floor (2 %), and on demand drawn ±20 % every interval three
rising draws of one edge read as a ramp whose room shed a quarter of that edge onto a far origin,
then eight relax steps of 30 s at its latency (``bench.sim_kinds`` noise 43 #4, testdata/: the
baseline never overloaded, ours 12.5 % slower)."""

from __future__ import annotations

import numpy as np

from opsloop.controllers.edge.controller import EdgeController
from tests.controllers.edge.drawn_cases import run_meeting_targets

LATENCY = np.array([20.0])


def _rising_after(readings: list[float]) -> bool:
    ctrl = EdgeController(1, 2)
    rising = np.zeros(1, dtype=bool)
    for x in readings:
        _, _, rising = ctrl._demand_estimate(np.array([x]), LATENCY)
    return bool(rising[0])


def test_three_rising_draws_before_sigma_is_known_are_no_ramp():
    # five readings (four changes): three rises of ~10 % each after a dip, as ±20 % draws give
    assert not _rising_after([150.0, 130.0, 140.0, 153.0, 172.0])


def test_the_same_rises_once_sigma_is_known_are_a_ramp():
    # the rule still reads a ramp from the sixth reading on (σ known, here at the noise floor)
    assert _rising_after([150.0] * 6 + [140.0, 153.0, 172.0])


def test_a_noise_draw_with_early_rising_draws_meets_the_targets():
    run = run_meeting_targets("noise-43-4")
    # no shed nor room made in the first five ticks, before σ is known
    assert not any("shed" in r or "making room" in r for r in run.tick_reasons[:5]), run.tick_reasons[:5]
