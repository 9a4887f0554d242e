"""bench/sim_kinds.py: every kind's generator gives scenarios that validate (also read back from the YAML
it writes), are the same for a seed, kind and index, and really have their kind's situation; one short
run through the verdict; the command line's errors are one line."""

from __future__ import annotations

import copy
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from bench.sim_kinds import (KINDS, generate, line, main, nearest_weights, run_one, settled, situation,
                             table, write)
from opsloop.controllers.edge.sim import Scenario, load_scenario, simulate
from tests.helpers import REPO

INDEXES = range(3)


@lru_cache(maxsize=None)
def drawn(kind: str, index: int) -> tuple[Scenario, dict]:
    """Seed 1's scenarios, drawn once for the tests of each kind's situation (a shortfall takes ~0.4 s)."""
    return generate(kind, 1, index)


def caps(scn: Scenario) -> np.ndarray:
    return np.array([o.capacity_rps for o in scn.origins])


@pytest.mark.parametrize("kind", KINDS)
def test_scenarios_validate_and_are_deterministic(kind: str, tmp_path: Path) -> None:
    docs = []
    for index in INDEXES:
        scn, doc = generate(kind, 3, index)
        again, doc_again = generate(kind, 3, index)
        assert doc == doc_again and scn == again
        write(doc, tmp_path)
        assert load_scenario(tmp_path / f"{kind}-3-{index}.yaml") == scn   # what --write saves reruns alike
        assert 10 <= scn.interval_s <= 30 and 0.01 <= scn.noise <= 0.03 and 0 <= scn.overload_slowdown <= 3
        assert scn.controllers == ["ours", "fixed-step"]
        for edge in scn.edges:
            assert all(5 <= ms <= 150 for ms in edge.latency_ms.values())
            assert 0.5 <= edge.elasticity <= 1.0
        assert not situation(kind, scn)
        docs.append(doc)
    assert len({str(d) for d in docs}) == len(docs)               # indexes differ
    assert generate(kind, 4, 0)[1] != docs[0]                      # seeds differ


def test_events_fall_on_and_between_ticks() -> None:
    scns = [drawn(kind, i)[0] for kind in ("failure", "halved", "surge") for i in range(8)]
    aligned = [s.events[0].at % s.interval_s == 0 for s in scns]
    assert any(aligned) and not all(aligned)


def test_useu_starts_on_the_near_origin_over_its_capacity() -> None:
    for index in INDEXES:
        scn, _ = drawn("useu", index)
        assert all(e.initial_weights == {"o1": 1.0, **{o.name: 0.0 for o in scn.origins[1:]}} for e in scn.edges)
        assert all(e.latency_ms["o1"] < e.latency_ms["o2"] for e in scn.edges)
        assert settled(scn, 0.0).loads[0] > 1.1 * caps(scn)[0]


def test_failure_leaves_an_origin_down_then_back_with_room_elsewhere() -> None:
    for index in INDEXES:
        scn, _ = drawn("failure", index)
        changes = [ev for ev in scn.events if ev.health]
        (name, down), (name_back, up) = (next(iter(ev.health.items())) for ev in changes)
        assert name == name_back and not down and up and changes[1].at > changes[0].at
        others = sum(o.capacity_rps for o in scn.origins if o.name != name)
        assert others > sum(e.base_rps for e in scn.edges)
        assert (settled(scn, changes[0].at).loads / caps(scn)).max() > 1.1   # the next-nearest overflows


def test_mesh_ramps_to_a_peak_that_overflows_the_near_origins_only() -> None:
    for index in INDEXES:
        scn, _ = drawn("mesh", index)
        up = scn.events[0]
        assert up.ramp_s and 1.3 <= up.demand_scale <= 1.6
        assert (settled(scn, up.at).loads / caps(scn)).max() > 1.05
        assert sum(e.base_rps for e in scn.edges) * up.demand_scale < caps(scn).sum()


def test_shortfall_demand_is_above_all_capacity() -> None:
    for index in INDEXES:
        scn, _ = drawn("shortfall", index)
        up = scn.events[0]
        assert sum(e.base_rps for e in scn.edges) * up.demand_scale > 1.05 * caps(scn).sum()
        assert settled(scn, up.at, "fair").rates.sum() > 1.03 * caps(scn).sum()   # clients settled too


def test_surge_overloads_the_near_origin_at_the_fixed_step_weights() -> None:
    scn, _ = drawn("surge", 0)
    up = scn.events[0]
    edge = [e.name for e in scn.edges].index(next(iter(up.demand_scale)))
    home = int(np.argmax(nearest_weights(settled(scn, 0.0).latency, np.ones(len(scn.origins), bool))[edge]))
    run = simulate(scn, "fixed-step")
    after = (run.times > up.at + (up.ramp_s or 0) + 2 * scn.interval_s) \
        & (run.times < up.at + (up.ramp_s or 0) + 4 * scn.interval_s)
    assert (run.loads[after, home] > 1.1 * caps(scn)[home]).all()
    assert sum(e.base_rps for e in scn.edges) + (up.demand_scale[scn.edges[edge].name] - 1) \
        * scn.edges[edge].base_rps < caps(scn).sum()


def test_noise_is_true_demand_noise_near_the_near_origins_capacity() -> None:
    modes = set()
    for index in range(6):
        scn, _ = drawn("noise", index)
        level = settled(scn, 0.0).loads[0] / caps(scn)[0]
        assert 0.88 <= level <= 0.98
        if scn.demand_noise:
            assert 0.07 <= scn.demand_noise <= 0.12
            modes.add("gaussian")
        else:
            draws = [v / e.base_rps for ev in scn.events for e in scn.edges for k, v in ev.demand.items()
                     if k == e.name]
            assert len(draws) >= 5 and 0.8 <= min(draws) and max(draws) <= 1.2 and max(draws) > 1 / level
            modes.add("uniform")
    assert modes == {"gaussian", "uniform"}


def test_flapping_toggles_health_every_interval_with_and_without_a_detection_delay() -> None:
    delays = set()
    for index in range(6):
        scn, _ = drawn("flapping", index)
        flips = [ev for ev in scn.events if ev.health]
        assert len(flips) >= 5 and len({next(iter(ev.health)) for ev in flips}) == 1
        assert [next(iter(ev.health.values())) for ev in flips] == [i % 2 == 1 for i in range(len(flips))]
        assert np.allclose(np.diff([ev.at for ev in flips]), scn.interval_s)
        delays.add(scn.health_detection_delay_s > 0)
    assert delays == {True, False}


def test_halved_capacity_leaves_the_origin_well_over_at_the_current_weights() -> None:
    for index in INDEXES:
        scn, _ = drawn("halved", index)
        cut = scn.events[0]
        name, new = next(iter(cut.capacity.items()))
        j = [o.name for o in scn.origins].index(name)
        assert 0.4 * caps(scn)[j] - 0.1 <= new <= 0.6 * caps(scn)[j] + 0.1
        assert settled(scn, 0.0).loads[j] > 1.1 * new


def test_situation_names_what_a_scenario_of_another_kind_lacks() -> None:
    doc = copy.deepcopy(drawn("surge", 0)[1])   # the cached draw stays as drawn
    doc["events"][0]["demand_scale"] = {k: 1.0 for k in doc["events"][0]["demand_scale"]}
    assert any("near origin at" in p for p in situation("surge", Scenario.model_validate(doc)))
    doc = copy.deepcopy(drawn("flapping", 0)[1])
    doc["events"] = doc["events"][:3]
    assert any("3 health changes" in p for p in situation("flapping", Scenario.model_validate(doc)))


def test_one_short_run_through_the_verdict() -> None:
    scn, _ = drawn("halved", 0)
    short = scn.model_copy(update={"duration_s": scn.events[0].at + 6 * scn.interval_s, "events": scn.events[:1]})
    r = run_one("halved", 0, short)
    assert set(r["baseline_overload_s"]) == {"fixed-step", "fixed-step-headroom"}
    assert set(r["control"]) <= set(r["violations"])
    assert line(r).startswith(("ok   halved", "MISS halved"))
    missed = {**r, "violations": ["x"], "control": [], "fixed_step": ["y"]}
    rows = table([r, missed], ["halved"]).splitlines()
    passed = int(not r["violations"])
    assert rows[1].split() == ["halved", "2", f"{passed}/2", f"{int(not r['control']) + 1}/2",
                               f"{int(not r['fixed_step'])}/2"]
    assert rows[2].split()[0] == "total"


@pytest.mark.parametrize("argv, says", [(["--kinds", "surge,bogus"], "unknown kind bogus"),
                                        (["--per-kind", "0"], "--per-kind"),
                                        (["--jobs", "x"], "not an integer")])
def test_bad_arguments_are_one_line_exit_2(argv: list[str], says: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_write_to_a_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["--write", str(tmp_path / "f" / "sub"), "--kinds", "useu", "--per-kind", "1"])
    assert exc.value.code == 2 and "--write" in capsys.readouterr().err


def test_help_has_examples() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.sim_kinds", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage:") and "examples:" in out.stdout
