"""Findings whose condition went away by a path the detector did not look at: each must clear, not stay open.

* power: a server moved to another generation (its inventory corrected in the config or the collector's tag), taken
  out of service, or left in a generation too small to compare. Its ``power.generation_deviation`` (a warning, a page)
  and its ``power.cost``/``power.idle_candidate`` name the old generation in ``where``; before, nothing refreshed or
  cleared them again while the host kept reporting (no TTL either): open for good.
* keystone: a heavy-hitter credential whose validations stop (cached in RadosGW, what the finding asks for; or no
  signed request at all). The sliding window moved only with a counted validation; before, it stood still and the
  ``keystone.heavy_hitter`` finding stayed open for good while the frontend kept reporting its rounds.
"""

from __future__ import annotations

import orjson

from opsloop.records import Metric, metric
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.detectors.power.settings import PowerSettings

T0 = 1_795_100_000.0
DEVIATION, COST, HEAVY = "power.generation_deviation", "power.cost", "keystone.heavy_hitter"


def _power_round(t: float, hosts: dict[str, tuple[str, float]]) -> list[Metric]:
    return [metric("ipmi_power", {"watts": w}, {"host": h, "generation": g, "raw_capacity_tb": "48"}, t)
            for h, (g, w) in hosts.items()]


def _restarted(h: PowerHandler, settings: PowerSettings) -> PowerHandler:
    """A new worker with ``settings``, restored from ``h``'s state as the changelog carries it (JSON)."""
    states = {k: orjson.loads(orjson.dumps(s)) for k in h.detector.sums if (s := h.state_of(k)) is not None}
    fresh = PowerHandler(settings, h.refresh_s)
    fresh.restore(states)
    return fresh


def _open(h: object, detector: str) -> list[dict[str, str]]:
    return sorted((f.where for f in h.open_findings() if f.detector == detector),  # type: ignore[attr-defined]
                  key=lambda w: sorted(w.items()))


def _deviating(h: PowerHandler, rounds: int = 5) -> float:
    """Three gen2 servers near 205 W and x at 320 W: x's deviation opens. The last round's time."""
    t = T0
    for i in range(rounds):
        t = T0 + 60 * i
        h.handle(_power_round(t, {"a": ("gen2", 200.0), "b": ("gen2", 205.0), "c": ("gen2", 210.0),
                                  "x": ("gen2", 320.0)}), t)
    assert _open(h, DEVIATION) == [{"host": "x", "generation": "gen2"}]
    h.drain_outbox()
    return t


def test_a_server_moved_to_another_generation_clears_its_findings_of_the_old_one() -> None:
    h = PowerHandler(PowerSettings())
    t = _deviating(h)
    # the collector's inventory tag corrected: x is a gen1 box (248 W is its normal draw)
    for i in range(1, 4):
        h.handle(_power_round(t + 60 * i, {"a": ("gen2", 200.0), "b": ("gen2", 205.0), "c": ("gen2", 210.0),
                                           "x": ("gen1", 320.0)}), t + 60 * i)
    cleared = {(f.detector, f.where["generation"]) for e, f in h.drain_outbox()
               if e == "cleared" and f.where["host"] == "x"}
    assert cleared == {(DEVIATION, "gen2"), (COST, "gen2")}
    assert _open(h, DEVIATION) == []
    assert [w for w in _open(h, COST) if w["host"] == "x"] == [{"host": "x", "generation": "gen1"}]


def test_a_generation_corrected_in_the_config_clears_across_a_restart() -> None:
    h = PowerHandler(PowerSettings())
    t = _deviating(h)
    h2 = _restarted(h, PowerSettings.model_validate({"hosts": {"x": {"generation": "gen1"}}}))
    assert _open(h2, DEVIATION) == [{"host": "x", "generation": "gen2"}]   # restored as it was
    h2.handle(_power_round(t + 60, {"x": ("gen2", 320.0)}), t + 60)   # the tag still says gen2: the config wins
    assert [(e, f.where["generation"]) for e, f in h2.drain_outbox() if f.detector == DEVIATION] == \
        [("cleared", "gen2")]
    assert _open(h2, DEVIATION) == []
    # the state written for x says so: a second restart does not bring the finding back
    h3 = _restarted(h2, PowerSettings.model_validate({"hosts": {"x": {"generation": "gen1"}}}))
    assert _open(h3, DEVIATION) == [] and {w["generation"] for w in _open(h3, COST) if w["host"] == "x"} == {"gen1"}


def test_a_server_taken_out_of_service_clears_its_deviation() -> None:
    h = PowerHandler(PowerSettings())
    t = _deviating(h)
    h2 = _restarted(h, PowerSettings.model_validate({"hosts": {"x": {"in_service": False}}}))
    h2.handle(_power_round(t + 60, {"a": ("gen2", 200.0), "b": ("gen2", 205.0), "c": ("gen2", 210.0),
                                    "x": ("gen2", 320.0)}), t + 60)
    events = {(e, f.detector) for e, f in h2.drain_outbox() if f.where["host"] == "x"}
    assert ("cleared", DEVIATION) in events and ("opened", "power.idle_candidate") in events
    assert _open(h2, DEVIATION) == []


def test_a_generation_left_too_small_to_compare_clears_its_deviations() -> None:
    h = PowerHandler(PowerSettings())
    h.bound_state(max_clock_skew_s=600.0, state_ttl_s=300.0, max_state_keys=1000)
    t = _deviating(h)
    # b and c are decommissioned: dropped by the TTL; two servers have no median to deviate from
    for i in range(1, 12):
        h.handle(_power_round(t + 60 * i, {"a": ("gen2", 200.0), "x": ("gen2", 320.0)}), t + 60 * i)
    assert "b" not in h.detector.sums and "c" not in h.detector.sums
    assert _open(h, DEVIATION) == []
    assert ("cleared", DEVIATION, "x") in {(e, f.detector, f.where["host"]) for e, f in h.drain_outbox()}


def _frontend_round(t: float, validations: dict[str, float], host: str = "rgw-1") -> list[Metric]:
    """One collector round (collectors/keystone/aggregate.py): totals, then one row per signed access key."""
    total = sum(validations.values())
    out = [metric("s3_frontend_requests", {"requests": 400.0, "signed": 400.0, "keystone_validations": total,
                                           "small_requests": 0.0}, {"host": host}, t)]
    out += [metric("s3_frontend_credential", {"requests": 100.0, "keystone_validations": v},
                   {"host": host, "access_key": k}, t) for k, v in validations.items()]
    return out


def _heavy(h: KeystoneHandler) -> float:
    t = T0
    for i in range(8):
        t = T0 + 60 * i
        h.handle(_frontend_round(t, {"AKHEAVY": 500.0, "AKOTHER": 20.0}), t)
    assert _open(h, HEAVY) == [{"host": "rgw-1", "credential": "AKHEAVY"}]
    h.drain_outbox()
    return t


def test_a_heavy_hitter_clears_once_its_validations_are_cached() -> None:
    h = KeystoneHandler()
    t = _heavy(h)
    # the runbook's fix: RadosGW caches the validations; the frontend still reports every key, with 0 validations
    for i in range(1, 8):
        h.handle(_frontend_round(t + 60 * i, {"AKHEAVY": 0.0, "AKOTHER": 0.0}), t + 60 * i)
    assert ("cleared", HEAVY) in {(e, f.detector) for e, f in h.drain_outbox()}
    assert _open(h, HEAVY) == []


def test_a_heavy_hitter_clears_when_no_signed_request_comes_any_more() -> None:
    h = KeystoneHandler()
    t = _heavy(h)
    for i in range(1, 8):   # anonymous traffic only: no credential rows at all
        h.handle(_frontend_round(t + 60 * i, {}), t + 60 * i)
    assert _open(h, HEAVY) == []
    # validations back: the window counts them as before, and a heavy hitter opens again (a new incident)
    t += 8 * 60
    for i in range(8):
        h.handle(_frontend_round(t + 60 * i, {"AKHEAVY": 500.0, "AKOTHER": 20.0}), t + 60 * i)
    assert _open(h, HEAVY) == [{"host": "rgw-1", "credential": "AKHEAVY"}]
