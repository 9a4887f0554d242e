"""LVS: a write of ours that the weight history does not record (a read-back ``mismatch``, a torn ``ipvsadm
-R`` whose undo failed, a crash between the write and the record) may leave a real at 0 while the history
still gives it a weight. That 0 is ours, not keepalived's: the quiesce rule (live 0, stored > 0 -> DOWN,
held at 0) must not take it for a health checker's, or every later decision feeding that real is refused
or held at 0 for good. A real set to 0 by the health checker (outside the actuator) is still respected.
Fake ipvsadm (recorded output), another writer or a timeout injected around its ``-R``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import pytest

from opsloop.audit.trail import AuditLog

from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import LvsTargetConfig
from opsloop.controllers.actuators.lvs import LvsTarget
from opsloop.controllers.actuators.store import WeightStore
from tests.controllers.actuators.support import ListSink, decision
from tests.controllers.actuators.test_lvs import HERE, lvs_actuator
from tests.controllers.actuators.test_lvs_quiesce import REALS, SERVICE, fake, set_live  # noqa: F401 - fixture

HALF = {"eu": 0.5, "us": 0.5, "spare": 0.0}


class Crash(BaseException):
    """The process dies here (nothing in the actuator may catch it)."""


def after_restore(act: EdgeActuator, then: Callable[[], None]) -> Callable[[], None]:
    """Run ``then`` right after each ``ipvsadm -R`` of ``act`` (another writer); returns the undo."""
    original = act.target._run

    def run(args: list[str], stdin: str | None = None) -> str:
        out = original(args, stdin)
        if args == ["-R"]:
            then()
        return out

    act.target._run = run  # type: ignore[method-assign]
    return lambda: delattr(act.target, "_run")


def applied_half(fake: Path, tmp_path: Path, **kw: float) -> tuple[EdgeActuator, ListSink]:
    act, sink = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS, max_step=1.0, **kw)
    assert act.apply(decision(1, HALF, edge=act.edge, listener="app")).result == "applied"
    assert act.read() == {"eu": 5000, "us": 5000, "spare": 0}
    return act, sink


def mismatch_zeroing_eu(act: EdgeActuator, fake: Path) -> None:
    """v2 moves everything off eu; another writer touches spare right after the batch: read-back mismatch,
    nothing recorded, eu left at 0 by our own write."""
    stop = after_restore(act, lambda: set_live(fake, "spare", 5))
    r = act.apply(decision(2, {"eu": 0.0, "us": 1.0, "spare": 0.0}, edge=act.edge, listener="app"))
    stop()
    assert r.result == "mismatch", r.reason
    assert act.read() == {"eu": 0, "us": 10000, "spare": 5}
    assert act.store.last().version == 1 and act.store.last().weights["eu"] == 5000   # not recorded


def test_a_real_our_mismatched_write_zeroed_is_not_taken_for_quiesced(fake: Path, tmp_path: Path) -> None:
    act, sink = applied_half(fake, tmp_path)
    mismatch_zeroing_eu(act, fake)
    # a decision giving every share to eu: eu is not DOWN (nobody but us set it to 0)
    r = act.apply(decision(3, {"eu": 1.0, "us": 0.0, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "applied", r.reason
    assert act.read() == {"eu": 10000, "us": 0, "spare": 0} and "quiesced" not in r.reason


def test_a_real_our_mismatched_write_zeroed_gets_its_share_back(fake: Path, tmp_path: Path) -> None:
    act, _ = applied_half(fake, tmp_path)
    mismatch_zeroing_eu(act, fake)
    r = act.apply(decision(3, {"eu": 0.4, "us": 0.6, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "applied" and "quiesced" not in r.reason, r.reason
    assert act.read() == {"eu": 4000, "us": 6000, "spare": 0}       # not held at 0 for good


def test_reconcile_repairs_what_our_mismatched_write_left(fake: Path, tmp_path: Path) -> None:
    """The decision is given up (no newer one): reconcile puts the recorded weights back, eu included."""
    act, _ = applied_half(fake, tmp_path)
    mismatch_zeroing_eu(act, fake)
    r = act.reconcile()
    assert r is not None and r.result == "applied" and "quiesced" not in r.reason, r and r.reason
    assert act.read() == {"eu": 5000, "us": 5000, "spare": 0}


def test_a_torn_batch_whose_undo_failed_then_a_different_decision(fake: Path, tmp_path: Path) -> None:
    """``ipvsadm -R`` took effect and then timed out; the undo failed (ipvsadm wedged): eu at 0, nothing
    recorded. ipvsadm comes back with another decision that needs eu."""
    act, _ = applied_half(fake, tmp_path)
    original = act.target._run
    mode = Path(str(fake) + ".mode")

    def torn(args: list[str], stdin: str | None = None) -> str:
        out = original(args, stdin)
        if args == ["-R"] and not mode.exists():
            mode.write_text("fail")                         # the undo that follows fails
            raise ActuatorError(f"{act.target.describe()}: -R timed out", "unreachable")
        return out

    act.target._run = torn  # type: ignore[method-assign]
    r = act.apply(decision(2, {"eu": 0.0, "us": 0.5, "spare": 0.5}, edge=act.edge, listener="app"))
    assert r.result == "failed" and "restoring the previous weights failed too" in r.reason, r.reason
    del act.target._run
    mode.unlink()
    assert act.read() == {"eu": 0, "us": 5000, "spare": 5000}
    r = act.apply(decision(3, {"eu": 1.0, "us": 0.0, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "applied", r.reason
    assert act.read() == {"eu": 10000, "us": 0, "spare": 0}


def test_a_crash_between_the_write_and_the_record(fake: Path, tmp_path: Path) -> None:
    """What a write may have done must survive the process: the next one reads it from the store."""
    act, _ = applied_half(fake, tmp_path)

    def crash(entry: object) -> None:
        raise Crash("killed after the batch, before the history entry")

    act.store.append = crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        act.apply(decision(2, {"eu": 0.0, "us": 1.0, "spare": 0.0}, edge=act.edge, listener="app"))
    assert act.read() == {"eu": 0, "us": 10000, "spare": 0}
    cfg = LvsTargetConfig(kind="lvs", edge=act.edge, listener="app", service=f"tcp:{SERVICE}", reals=REALS,
                          command=[sys.executable, str(HERE / "fake_ipvsadm.py"), "--state", str(fake)])
    again = EdgeActuator(LvsTarget(cfg), act.edge, "app", WeightStore(tmp_path / "store", act.edge, "app"),
                         AuditLog([ListSink()]), weight_total=cfg.weight_total, max_step=1.0)
    r = again.apply(decision(3, {"eu": 1.0, "us": 0.0, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "applied", r.reason
    assert again.read() == {"eu": 10000, "us": 0, "spare": 0}


# -- the health checker's quiesce is still respected -----------------------------------------------------------

def test_a_quiesced_real_held_at_zero_by_a_mismatched_write_stays_quiesced(fake: Path, tmp_path: Path) -> None:
    """keepalived zeroed eu; our next batch held it at 0 (written 0) and mismatched: that 0 was keepalived's,
    it must still be respected (not revived by the next decision)."""
    act, _ = applied_half(fake, tmp_path)
    set_live(fake, "eu", 0)                                 # keepalived: eu's health check failed
    stop = after_restore(act, lambda: set_live(fake, "spare", 5))
    r = act.apply(decision(2, {"eu": 0.4, "us": 0.6, "spare": 0.0}, edge=act.edge, listener="app"))
    stop()
    assert r.result == "mismatch" and act.read()["eu"] == 0
    r = act.apply(decision(3, {"eu": 1.0, "us": 0.0, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "refused" and "DOWN" in r.reason, r.reason
    r = act.apply(decision(4, HALF, edge=act.edge, listener="app"))
    assert r.result == "applied" and act.read() == {"eu": 0, "us": 5000, "spare": 0}, r.reason
    assert act.reconcile() is None and act.read()["eu"] == 0
    set_live(fake, "eu", 1)                                 # restored by keepalived
    assert act.reconcile() is not None and act.read() == {"eu": 5000, "us": 5000, "spare": 0}


def test_once_recorded_a_later_quiesce_of_the_same_real_is_respected(fake: Path, tmp_path: Path) -> None:
    """What an unrecorded write may have done is forgotten once a write is read back and recorded: a
    quiesce of that real afterwards is keepalived's again."""
    act, _ = applied_half(fake, tmp_path)
    mismatch_zeroing_eu(act, fake)
    assert act.apply(decision(3, HALF, edge=act.edge, listener="app")).result == "applied"
    assert act.store.unverified_zeroed() == set()
    set_live(fake, "eu", 0)                                 # keepalived, this time
    r = act.apply(decision(4, {"eu": 1.0, "us": 0.0, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "refused" and "DOWN" in r.reason, r.reason


def test_unreadable_record_of_unverified_writes_counts_every_zero_as_ours(fake: Path, tmp_path: Path) -> None:
    """A damaged file cannot say which 0 is ours: none is taken for a quiesce (the invariant's side), until
    the next write read back and recorded replaces it."""
    act, _ = applied_half(fake, tmp_path)
    mismatch_zeroing_eu(act, fake)
    act.store.unverified_path.write_bytes(b"{not json")
    assert act.store.unverified_zeroed() is None
    r = act.apply(decision(3, {"eu": 1.0, "us": 0.0, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "applied", r.reason
    assert not act.store.unverified_path.exists()


def test_nothing_is_noted_for_writes_that_zero_no_recorded_weight(fake: Path, tmp_path: Path) -> None:
    """Only a 0 written over a recorded weight above 0 is noted (spare stays 0): no extra file write."""
    act, _ = applied_half(fake, tmp_path)
    assert act.apply(decision(2, {"eu": 0.4, "us": 0.6, "spare": 0.0}, edge=act.edge, listener="app")).result \
        == "applied"
    assert not act.store.unverified_path.exists()
    doc = json.loads(fake.read_text())
    assert [r["w"] for r in doc["services"][0]["reals"]] == [4000, 6000, 0]
