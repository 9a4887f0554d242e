"""The recovery watchdog when Faust's recovery ends while the watchdog waits for the consumer's positions.

Resuming the app's flow control clears every stream queue; after the recovery Faust has resumed the
streams and records are being delivered, so a re-seek then (which resumes the flow) would drop them
with no seek to fetch them again (the loss of streams/runtime/delivery.py's docstring).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from faust.types import TP

from tests.streams.runtime.test_watchdog import STALL_S, Rig


def test_a_recovery_that_ends_during_the_look_is_left_alone(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    tps = rig.recovering(stuck=(72, -1))
    rig.consumer.positions[tps["stuck"]] = 0          # nothing applied: a re-seek is due at half the limit
    flow_resumes: list[int] = []
    rig.dog.app.flow_control = SimpleNamespace(resume=lambda: flow_resumes.append(1))
    assert rig.step(0.0) is None                      # first look: the clock starts
    look = rig.consumer.position

    async def position_as_the_recovery_ends(tp: TP) -> int | None:
        rig.recovery._set_recovery_ended()            # Faust finishes while the watchdog waits for the consumer
        return await look(tp)

    rig.consumer.position = position_as_the_recovery_ends   # type: ignore[method-assign]
    assert rig.step(STALL_S / 2 + 0.5) is None
    assert rig.step(STALL_S) is None
    assert rig.consumer.seeks == [] and flow_resumes == [] and rig.exits == []


def test_a_recovery_that_ends_during_the_reseek_is_not_resumed_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    tps = rig.recovering(stuck=(72, -1))
    rig.consumer.positions[tps["stuck"]] = 0
    flow_resumes: list[int] = []
    rig.dog.app.flow_control = SimpleNamespace(resume=lambda: flow_resumes.append(1))
    seek = rig.consumer.seek_wait

    async def seek_as_the_recovery_ends(offsets: dict[TP, int]) -> None:
        await seek(offsets)
        rig.recovery._set_recovery_ended()

    rig.consumer.seek_wait = seek_as_the_recovery_ends   # type: ignore[method-assign]
    assert rig.step(0.0) is None
    assert rig.step(STALL_S / 2 + 0.5) == "reseek"
    assert rig.consumer.seeks == [{tps["stuck"]: 0}]
    assert flow_resumes == [] and tps["stuck"] not in rig.consumer.resumed
