"""The recovery watchdog (streams/runtime/watchdog.py) against Faust's real ``Recovery`` object.

No broker: the recovery's offsets and the consumer's positions are set by the test, the clock is
injected. The fail-over itself, against a real broker, is in tests/scale and bench/bench_failover.py.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.types import TP

from opsloop.config import ConfigError, load_settings
from opsloop.streams.runtime import health
from opsloop.streams.runtime.app import create_app
from opsloop.streams.runtime.watchdog import EXIT_RECOVERY_STALLED, RecoveryWatchdog

STALL_S = 8.0


class FakeConsumer:
    def __init__(self) -> None:
        self.positions: dict[TP, int | None] = {}
        self.seeks: list[dict[TP, int]] = []
        self.hang = False
        self.resumed: set[TP] = set()

    async def position(self, tp: TP) -> int | None:
        if self.hang:                 # aiokafka waits while a position is being reset
            await asyncio.Event().wait()
        return self.positions.get(tp)

    async def seek_wait(self, offsets: dict[TP, int]) -> None:
        self.seeks.append(dict(offsets))

    def resume_partitions(self, tps: set[TP]) -> None:
        self.resumed |= set(tps)

    def resume_flow(self) -> None:
        pass


class Rig:
    """Faust's real Recovery service of an app, a fake consumer, a hand-driven clock."""

    def __init__(self, tmp: Path) -> None:
        settings = load_settings(None, {"stream": {"data_dir": str(tmp / "streams")}})
        app = create_app(settings, app_id="t-watchdog")
        self.recovery = app.tables.recovery
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.consumer = FakeConsumer()
        self.now = 1000.0
        self.exits: list[int] = []
        fake_app = SimpleNamespace(tables=SimpleNamespace(recovery=self.recovery, changelog_queue=self.queue),
                                   consumer=self.consumer, flow_control=SimpleNamespace(resume=lambda: None))
        self.dog = RecoveryWatchdog(fake_app, STALL_S, exit=self.exits.append, clock=lambda: self.now,
                                    look_timeout_s=0.05)

    def recovering(self, **partitions: tuple[int, int]) -> dict[str, TP]:
        """Put the recovery in progress: name -> (highwater, offset) of active changelog partitions."""
        tps = {}
        self.recovery._set_recovery_started()
        for i, (name, (highwater, offset)) in enumerate(partitions.items()):
            tp = TP("t-watchdog-detector-state-changelog", i)
            self.recovery.active_highwaters[tp] = highwater
            self.recovery.active_offsets[tp] = offset
            tps[name] = tp
        return tps

    def step(self, seconds: float) -> str | None:
        self.now += seconds
        return asyncio.run(self.dog.check())


def actions(action: str) -> float:
    return health.RECOVERY_ACTIONS.labels(action)._value.get()


def test_faust_version_is_the_one_the_watchdog_was_measured_with() -> None:
    # The watchdog reads and ends Faust's recovery through its internals (active_offsets,
    # active_highwaters, need_recovery, flush_buffers, _set_recovery_ended, signal_recovery_end) and
    # leaves the group through aiokafka's coordinator. Another version: re-check those names and run
    # `python -m bench --only failover` before changing the pin.
    import aiokafka

    assert faust.__version__ == "0.15.3"
    assert aiokafka.__version__ == "0.14.0"
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from faust.tables.recovery import Recovery

    for name in ("active_offsets", "active_highwaters", "need_recovery", "flush_buffers", "_set_recovery_ended",
                 "signal_recovery_end", "in_recovery"):
        assert hasattr(Recovery, name) or name in Recovery.__annotations__, name
    assert hasattr(GroupCoordinator, "_maybe_leave_group")


def test_a_recovery_that_progresses_is_left_alone(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    tps = rig.recovering(a=(100_000, 0))
    for i in range(30):          # 30 checks, 5 s apart: far beyond the stall limit, but always progressing
        rig.recovery.active_offsets[tps["a"]] = 1000 * (i + 1)
        assert rig.step(5.0) is None
    assert rig.exits == [] and rig.consumer.seeks == []
    assert health.RECOVERY_REMAINING._value.get() == 100_000 - 30_000


def test_no_progress_reseeks_at_half_the_limit_then_exits_naming_the_partition(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(tmp_path)
    tps = rig.recovering(stuck=(72, -1), fine=(50, 50))
    rig.consumer.positions[tps["stuck"]] = 0         # sought to the start, nothing ever fetched
    exits_before, reseeks_before = actions("exit"), actions("reseek")
    assert rig.step(0.0) is None                      # first look: the clock starts
    assert rig.step(STALL_S / 2 - 0.5) is None
    assert rig.step(1.0) == "reseek"
    assert rig.consumer.seeks == [{tps["stuck"]: 0}] and tps["stuck"] in rig.consumer.resumed
    assert rig.step(1.0) is None                      # one re-seek per stall
    with caplog.at_level(logging.ERROR, logger="opsloop.stream.watchdog"):
        assert rig.step(STALL_S / 2) == "exit"
    assert rig.exits == [EXIT_RECOVERY_STALLED]
    assert actions("exit") == exits_before + 1 and actions("reseek") == reseeks_before + 1
    (record,) = [r for r in caplog.records if r.getMessage() == "recovery_stalled"]
    fields = record.__dict__["fields"]
    assert fields["partitions"] == [{"topic": tps["stuck"].topic, "partition": 0, "highwater": 72, "offset": -1,
                                     "position": 0}]


def test_a_consumer_that_does_not_answer_does_not_hold_the_watchdog(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.recovering(stuck=(72, -1))
    rig.consumer.hang = True
    rig.step(0.0)
    assert rig.step(STALL_S / 2) == "reseek"
    assert rig.step(STALL_S / 2) == "exit"
    assert rig.exits == [EXIT_RECOVERY_STALLED]


def test_progress_after_the_reseek_starts_the_clock_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    tps = rig.recovering(stuck=(72, -1))
    rig.consumer.positions[tps["stuck"]] = 0
    rig.step(0.0)
    assert rig.step(STALL_S / 2) == "reseek"
    rig.recovery.active_offsets[tps["stuck"]] = 10      # the re-seek worked: records arrive
    assert rig.step(STALL_S / 2 + 1) is None
    assert rig.step(STALL_S / 2 - 1) is None
    assert rig.exits == []


def test_records_fetched_but_lost_are_fetched_again(tmp_path: Path) -> None:
    # What the fail-over bench showed: the consumer is at the end of the partition (position 162), the
    # recovery applied nothing (offset -1). The records are read again, not skipped: no state is lost.
    rig = Rig(tmp_path)
    tps = rig.recovering(lost=(161, -1))
    rig.consumer.positions[tps["lost"]] = 162
    assert rig.step(1.0) is None                         # past the end once: maybe still on its way
    assert rig.step(1.0) == "reseek"
    assert rig.consumer.seeks == [{tps["lost"]: 0}] and tps["lost"] in rig.consumer.resumed
    rig.recovery.active_offsets[tps["lost"]] = 161        # the records arrive and are applied
    assert rig.step(1.0) is None
    assert rig.recovery.active_offsets[tps["lost"]] == 161 and rig.exits == []


def test_a_partition_ending_in_a_marker_is_read_again_then_caught_up(tmp_path: Path) -> None:
    # end offset 73: records 0..71, a transaction marker at 72. Faust waits for offset 72 forever.
    rig = Rig(tmp_path)
    tps = rig.recovering(marker=(72, 71))
    rig.consumer.positions[tps["marker"]] = 73
    rig.queue.put_nowait("a record still to apply")
    assert rig.step(1.0) is None                         # fetched, not applied yet: not at its end
    rig.queue.get_nowait()
    assert rig.step(1.0) is None                         # queue empty once: wait for a second look
    assert rig.step(1.0) == "reseek"                     # first: read it again (records may have been lost)
    assert rig.consumer.seeks == [{tps["marker"]: 71}]
    skipped_before = actions("gap_skipped")
    assert rig.step(1.0) is None
    assert rig.step(1.0) == "gap_skipped"                # at its end again, nothing more applied
    assert rig.recovery.active_offsets[tps["marker"]] == 72
    assert not rig.recovery.in_recovery and rig.recovery.signal_recovery_end.is_set()
    assert actions("gap_skipped") == skipped_before + 1 and rig.exits == []


def test_a_partition_still_being_applied_is_not_skipped(tmp_path: Path) -> None:
    # The consumer has handed out every record, a few are still on their way into the table.
    rig = Rig(tmp_path)
    tps = rig.recovering(busy=(72, 10))
    rig.consumer.positions[tps["busy"]] = 73
    for offset in range(20, 72, 10):
        rig.recovery.active_offsets[tps["busy"]] = offset
        assert rig.step(1.0) is None
    assert rig.consumer.seeks == [] and rig.recovery.in_recovery


def test_a_partition_short_of_its_end_is_not_skipped(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    tps = rig.recovering(behind=(72, 30))
    rig.consumer.positions[tps["behind"]] = 40          # still records to fetch
    for _ in range(3):
        assert rig.step(1.0) is None
    assert rig.recovery.active_offsets[tps["behind"]] == 30 and rig.recovery.in_recovery


def test_not_in_recovery_nothing_happens(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert not rig.recovery.in_recovery
    assert rig.step(1000.0) is None and rig.exits == []


def test_the_stall_limit_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="recovery_stall_s"):
        load_settings(None, {"stream": {"data_dir": str(tmp_path), "recovery_stall_s": 0}})
