"""Recovery watchdog: a stuck table recovery never stalls the stream stage for good.

What was seen (``python -m bench.bench_failover``; faust-streaming 0.15.3, aiokafka 0.14): after the
second of two workers is SIGKILLed, the survivor takes every partition and Faust recovers the
``detector-state`` changelog partitions, then waits forever: ``No event received for active tp ...
since recovery start`` every 5 s. Faust resumes the stream partitions only when every active changelog
partition has reached its highwater, so every agent (edge demand, every detector) stops. 1 fail-over in
12 stalled in the first run. The watchdog's log names the cause: the consumer's *position* in the stuck
partitions was already at their end (highwater 161, position 162) while the recovery had applied
nothing (offset -1), or stopped short (offset 273, highwater 289). The records had been fetched and then
lost between aiokafka's fetcher and Faust's changelog queue, and aiokafka does not fetch them again by
itself: its position is past them. Seeking back recovers them. (Where they are lost is read from the
code, not traced: Faust's ``Consumer.getmany`` skips records of a partition missing from its active set
at that instant, its drain loop skips records below a stale read offset, and both change during a
rebalance.)

A second class of the same symptom: the recovery waits for the record at ``end offset - 1``, which is
not a record when the partition ends in a transaction marker (a transactional producer wrote to it, or
the broker aborted a killed one's transaction). Faust skips such a gap only in exactly-once mode.
``tests/scale/test_recovery_watchdog.py`` reproduces it on purpose.

The watchdog looks at the recovery every second while Faust is in recovery:

1. **re-seek**: a lagging partition whose consumer position is past its highwater, with the changelog
   queue empty on two looks (nothing fetched is still on its way), is sought back to where the
   recovery reads next, once; so is every lagging partition when nothing was applied for
   ``stall_s / 2``. The lost records are fetched again and applied: no state is lost.
2. **gap skipped**: a partition that is again past its end after its re-seek, still short of its
   highwater, ends in something that is not a record (a marker): it is caught up; the recovery ends.
3. **exit**: nothing applied for ``stall_s``: an error log naming the partitions (highwater, offset,
   position), ``opsloop_stream_recovery_actions_total{action="exit"}``, a best-effort LeaveGroup (the
   partitions move at once instead of after a session timeout) and exit code
   :data:`EXIT_RECOVERY_STALLED`; the supervisor (``opsloop run``, systemd ``Restart=on-failure``)
   starts a fresh worker.

Decision, with the measurements of ``python -m bench --only failover`` (30 kill/fail-over cycles, each
must recover within ``session_timeout_s + 15 s``): fixing the recovery in place (1, 2) keeps a
fail-over at the cost of a rebalance; exiting (3) costs a process start and a second rebalance and is
the last resort for a cause not understood yet. Measured: before, 1 fail-over in 12 never recovered;
with the watchdog 30/30 recovered (p50 8.0 s, p99 10.1 s with a 6 s session timeout), the stall came
twice and was cured by a re-seek each time, no exit was needed. Table in the bench's docstring.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import faust
from faust.types import TP

from opsloop import exitcodes
from opsloop.log import get_logger
from opsloop.streams.runtime import health
from opsloop.streams.runtime.periodic import PeriodicService

log = get_logger("stream.watchdog")

EXIT_RECOVERY_STALLED = exitcodes.SOFTWARE   # 70, EX_SOFTWARE: the supervisor restarts the worker


@dataclass
class RecoveryWatchdog:
    """Watches one app's table recovery (see the module docstring). ``check`` is one step, for tests."""

    app: Any
    stall_s: float
    exit: Callable[[int], None] = os._exit
    clock: Callable[[], float] = time.monotonic
    look_timeout_s: float = 2.0     # longest wait for the consumer's positions in one look
    _progress_at: float | None = None
    _offsets: dict[TP, int] = field(default_factory=dict)
    _reseeked: set[TP] = field(default_factory=set)         # re-sought during this recovery
    _at_end: dict[TP, int] = field(default_factory=dict)    # tp -> consecutive looks past its end, queue empty

    @property
    def recovery(self) -> Any:
        return self.app.tables.recovery

    def lagging(self) -> dict[TP, tuple[int, int]]:
        """Active changelog partitions still short of their highwater: tp -> (highwater, offset)."""
        rec = self.recovery
        out: dict[TP, tuple[int, int]] = {}
        for tp, highwater in list(rec.active_highwaters.items()):
            offset = rec.active_offsets.get(tp)
            if highwater is not None and offset is not None and highwater > offset:
                out[tp] = (highwater, offset)
        return out

    async def positions(self, tps: list[TP]) -> dict[TP, int | None]:
        """The consumer's next fetch offset per partition; None where unknown (aiokafka waits for a
        position being reset: the look must not hang on it)."""
        async def one(tp: TP) -> int | None:
            try:
                return await asyncio.wait_for(self.app.consumer.position(tp), self.look_timeout_s)
            except Exception:  # noqa: BLE001 - not assigned any more / being reset / consumer restarting
                return None
        return dict(zip(tps, await asyncio.gather(*(one(tp) for tp in tps))))

    async def check(self) -> str | None:
        """One look at the recovery; returns the action taken (``reseek``, ``gap_skipped``, ``exit``) or None."""
        now = self.clock()
        rec = self.recovery
        if not rec.in_recovery:
            self._progress_at = None
            self._reseeked.clear()
            self._at_end.clear()
            health.RECOVERY_REMAINING.set(0)
            return None
        lagging = self.lagging()
        health.RECOVERY_REMAINING.set(sum(h - o for h, o in lagging.values()))
        offsets = dict(rec.active_offsets)
        if self._progress_at is None or offsets != self._offsets:
            self._progress_at, self._offsets = now, offsets
            self._at_end.clear()     # records are still being applied: "at the end" counts from here
        if not lagging:
            return None
        positions = await self.positions(sorted(lagging))
        if not rec.in_recovery:
            # Ended during the look: Faust has resumed the streams, and a re-seek now would resume the
            # flow control again, clearing stream queues no seek follows (records lost, see delivery.py).
            return None
        idle = self.clock() - self._progress_at
        if idle >= self.stall_s:
            await self._give_up(lagging, positions, idle)
            return "exit"
        drained = self._past_end(lagging, positions)
        if drained:
            fresh = {tp: lagging[tp] for tp in drained if tp not in self._reseeked}
            if fresh:
                await self._reseek(fresh, positions, "fetched to the end, but the records never reached the recovery")
                return "reseek"
            self._skip_gaps({tp: lagging[tp] for tp in drained}, positions)
            return "gap_skipped"
        fresh = {tp: v for tp, v in lagging.items() if tp not in self._reseeked}
        if idle >= self.stall_s / 2 and fresh:
            await self._reseek(fresh, positions, f"no changelog record applied for {idle:.0f} s")
            return "reseek"
        return None

    def _past_end(self, lagging: Mapping[TP, tuple[int, int]], positions: Mapping[TP, int | None]) -> list[TP]:
        """Lagging partitions with nothing left to fetch (position past the highwater) on two looks with
        the changelog queue empty and nothing applied in between (every fetched record has been applied
        or lost)."""
        queue_empty = self.app.tables.changelog_queue.empty()
        out: list[TP] = []
        for tp, (highwater, _) in lagging.items():
            pos = positions.get(tp)
            if pos is not None and pos > highwater and queue_empty:
                self._at_end[tp] = self._at_end.get(tp, 0) + 1
                if self._at_end[tp] >= 2:
                    out.append(tp)
            else:
                self._at_end.pop(tp, None)
        return out

    def _skip_gaps(self, gaps: Mapping[TP, tuple[int, int]], positions: Mapping[TP, int | None]) -> None:
        rec = self.recovery
        for tp, (highwater, offset) in gaps.items():
            log.warning("recovery_gap_skipped", topic=tp.topic, partition=tp.partition, highwater=highwater,
                        offset=offset, position=positions.get(tp),
                        reason="read to its end twice; what follows the last record is not a record "
                               "(transaction marker)")
            rec.active_offsets[tp] = highwater
            health.RECOVERY_ACTIONS.labels("gap_skipped").inc()
        if not rec.need_recovery():
            # What Faust's own end-of-recovery check does (it runs only when a record or a 5 s timeout
            # wakes its changelog reader).
            rec.flush_buffers()
            rec._set_recovery_ended()
            rec.signal_recovery_end.set()

    async def _reseek(self, tps: Mapping[TP, tuple[int, int]], positions: Mapping[TP, int | None],
                      reason: str) -> None:
        self._reseeked.update(tps)
        for tp in tps:
            self._at_end.pop(tp, None)
        # Where Faust's recovery seeks: the last applied offset (re-read and ignored), 0 for none.
        targets = {tp: max(offset, 0) for tp, (_, offset) in tps.items()}
        log.warning("recovery_reseek", partitions=_describe(tps, positions), reason=reason)
        health.RECOVERY_ACTIONS.labels("reseek").inc()
        consumer = self.app.consumer
        try:
            await consumer.seek_wait(targets)
            if not self.recovery.in_recovery:
                return   # ended during the seek: resuming the flow would clear the stream queues (above)
            consumer.resume_partitions(set(targets))
            self.app.flow_control.resume()
            consumer.resume_flow()
        except Exception as e:  # noqa: BLE001 - the exit step still follows
            log.error("recovery_reseek_failed", error=f"{type(e).__name__}: {e}")

    async def _give_up(self, lagging: Mapping[TP, tuple[int, int]], positions: Mapping[TP, int | None],
                       idle: float) -> None:
        health.RECOVERY_ACTIONS.labels("exit").inc()
        log.error("recovery_stalled", partitions=_describe(lagging, positions), idle_s=round(idle, 1),
                  exit_code=EXIT_RECOVERY_STALLED,
                  action="exiting for the supervisor to restart the worker (table recovery made no progress)")
        await _leave_group(self.app)
        for h in logging.getLogger().handlers:
            h.flush()
        self.exit(EXIT_RECOVERY_STALLED)


def _describe(lagging: Mapping[TP, tuple[int, int]], positions: Mapping[TP, int | None]) -> list[dict[str, Any]]:
    return [{"topic": tp.topic, "partition": tp.partition, "highwater": hw, "offset": off,
             "position": positions.get(tp)} for tp, (hw, off) in sorted(lagging.items())]


async def _leave_group(app: Any, timeout_s: float = 2.0) -> None:
    """Best effort: tell the group coordinator we are gone, so the restarted worker does not wait for
    this member's session to time out."""
    try:
        thread = app.consumer._thread
        coordinator = thread._ensure_consumer()._coordinator
        await asyncio.wait_for(thread.call_thread(coordinator._maybe_leave_group), timeout_s)
    except Exception as e:  # noqa: BLE001 - exiting anyway; the session timeout does the same, later
        log.warning("leave_group_failed", error=f"{type(e).__name__}: {e}")


class _WatchdogService(PeriodicService):
    """Runs the checks from the app's start (Faust's ``app.task`` would start only after the first
    recovery, the one that may hang)."""

    def __init__(self, dog: RecoveryWatchdog, interval_s: float, **kwargs: Any) -> None:
        self.dog = dog
        super().__init__(interval_s, **kwargs)

    async def once(self) -> None:
        try:
            await self.dog.check()
        except Exception as e:  # noqa: BLE001 - the watchdog must not die of one bad look
            log.error("recovery_watchdog_failed", error=f"{type(e).__name__}: {e}", exc_info=True)


def install_recovery_watchdog(app: faust.App, stall_s: float, interval_s: float = 1.0) -> RecoveryWatchdog:
    """Start a :class:`RecoveryWatchdog` with the app (every worker; call before the app starts)."""
    dog = RecoveryWatchdog(app, stall_s)
    app.add_dependency(_WatchdogService(dog, interval_s))
    return dog
