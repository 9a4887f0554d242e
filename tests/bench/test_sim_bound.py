"""bench/sim_bound.py: the static oracle holds the initial weights through its warm-up and then exactly the LP
target on the true mean demand (run through the simulator's ``build`` hook); more headroom moves more traffic
off the near origin; the command line rejects bad lists in one line."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim_bound import LearnedStatic, StaticOracle, main
from bench.sim_kinds import generate
from opsloop.controllers.edge.scheduler import solve
from opsloop.controllers.edge.sim import simulate


def test_the_oracle_holds_the_initial_weights_then_the_static_target() -> None:
    scn, _ = generate("noise", 1, 0)
    run = simulate(scn, "static-oracle", lambda s, w: StaticOracle(s, w, 0.1, warmup=2))
    weights = np.array(run.tick_weights)          # [0]: the initial weights, then one per tick
    assert run.controller == "static-oracle"
    np.testing.assert_array_equal(weights[1], weights[0])
    np.testing.assert_array_equal(weights[2], weights[0])
    mean = np.array([e.base_rps for e in scn.edges])
    capacity = np.array([o.capacity_rps for o in scn.origins])
    latency = np.array([[e.latency_ms.get(o.name, np.inf) for o in scn.origins] for e in scn.edges])
    target = solve(mean, capacity, latency, np.ones(len(scn.origins), dtype=bool), headroom=0.1).weights
    assert not np.allclose(target, weights[0])    # the noise kind starts above 0.9 of the near origin
    for later in weights[3:]:
        np.testing.assert_allclose(later, target, atol=1e-9)


def test_the_learned_policy_holds_the_target_on_the_mean_of_its_own_readings() -> None:
    scn, _ = generate("noise", 1, 2)
    policy: list[LearnedStatic] = []

    def build(s, w):  # type: ignore[no-untyped-def]
        policy.append(LearnedStatic(s, w, 0.1, warmup=2))
        return policy[0]
    run = simulate(scn, "learned-static", build)
    weights = np.array(run.tick_weights)
    np.testing.assert_array_equal(weights[1], weights[0])
    np.testing.assert_array_equal(weights[2], weights[0])
    readings = np.array(policy[0]._readings)
    assert len(readings) == len(weights) - 1
    np.testing.assert_allclose(policy[0].mean_demand, readings[:3].mean(axis=0))   # the 3 read by its tick
    true_mean = np.array([e.base_rps for e in scn.edges])
    assert not np.allclose(policy[0].mean_demand, true_mean)   # a noisy estimate, not the oracle's knowledge
    for later in weights[4:]:
        np.testing.assert_array_equal(later, weights[3])


def test_more_headroom_moves_more_traffic_off_the_near_origin() -> None:
    scn, _ = generate("noise", 1, 1)
    near = int(np.argmax(np.array(simulate(scn, "fixed-step").tick_weights)[0].sum(axis=0)))

    def share(h: float) -> float:
        run = simulate(scn, "static-oracle", lambda s, w: StaticOracle(s, w, h, warmup=0))
        return float(np.array(run.tick_weights)[-1][:, near].sum())
    assert share(0.0) > share(0.1) > share(0.2)


@pytest.mark.parametrize("argv, error", [
    (["--seeds", "a,b"], "comma-separated integers"),
    (["--warmups", "-1"], "warm-up"),
    (["--seeds", "-4"], "seed ≥ 0"),
    (["--latency-budget", "0.5"], "latency budget"),
])
def test_bad_arguments_are_one_line(argv: list[str], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and error in capsys.readouterr().err
