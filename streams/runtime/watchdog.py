"""Recovery watchdog: a stuck table recovery never stalls the stream stage for good.

What was seen (``python -m bench.bench_failover``, faust-streaming 0.15.3, aiokafka 0.14): after the
second of two workers is SIGKILLed, the survivor takes every partition, Faust starts recovering the
``detector-state`` changelog partitions it held as *standby* (already caught up: standby offset =
highwater), seeks them to the start as active partitions, and then never receives a single record
from them: ``No event received for active tp ... since recovery start`` every 5 s. Faust resumes the
stream partitions only after every active changelog partition has reached its highwater, so every
agent (edge demand, every detector) stops. 1 cycle in 6 stalled in the first run (cycle 6). The fetch
of those partitions is lost between Faust's own bookkeeping (paused/active sets, read offsets) and
aiokafka's fetcher (which fetches a partition again only after its last fetched records were handed
out); Faust has no path that notices it.

A second class of the same symptom: the recovery waits for the record *at* ``end offset - 1``, which
is not a record when the changelog partition ends in a transaction marker (or a gap): it can never
arrive. Faust skips such a gap only in exactly-once mode (``detect_aborted_tx``).

The watchdog checks the recovery every ``interval_s`` while Faust is in recovery:

1. a lagging partition whose consumer position is already at its end offset (nothing left to fetch)
   and whose records have all been handed over is caught up: its recovery offset is set to the
   highwater and the recovery ends (``gap_skipped``);
2. no recovery progress (no changelog record applied) for ``stall_s / 2``: the lagging partitions are
   sought again to where the recovery reads next and resumed (``reseek``);
3. no progress for ``stall_s``: an error log naming the partitions (highwater, offset, position), the
   counter ``opsloop_stream_recovery_actions_total{action="exit"}``, a best-effort LeaveGroup (the
   partitions move at once instead of after a session timeout), and exit code
   :data:`EXIT_RECOVERY_STALLED` — the supervisor (``opsloop run``, systemd ``Restart=on-failure``)
   starts a fresh worker, whose recovery starts from nothing.

Decision and figures: ``bench/bench_failover.py`` (README of the figures in its docstring and in the
report that introduced this module). Restarting is the last resort because it costs a process start
plus a rebalance; a re-seek costs nothing when it works.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import faust
import mode
from faust.types import TP

from opsloop.log import get_logger
from streams.runtime import health

log = get_logger("stream.watchdog")

EXIT_RECOVERY_STALLED = 70   # EX_SOFTWARE: the supervisor restarts the worker


@dataclass
class RecoveryWatchdog:
    """Watches one app's table recovery (see the module docstring). ``check`` is one step, for tests."""

    app: Any
    stall_s: float
    exit: Callable[[int], None] = os._exit
    clock: Callable[[], float] = time.monotonic
    _progress_at: float | None = None
    _offsets: dict[TP, int] = field(default_factory=dict)
    _reseeked: bool = False
    _at_end: dict[TP, int] = field(default_factory=dict)   # tp -> consecutive checks at its end, queue empty

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
        out: dict[TP, int | None] = {}
        for tp in tps:
            try:
                out[tp] = await self.app.consumer.position(tp)
            except Exception:  # noqa: BLE001 - not assigned any more / consumer restarting
                out[tp] = None
        return out

    async def check(self) -> str | None:
        """One look at the recovery; returns the action taken (``gap_skipped``, ``reseek``, ``exit``) or None."""
        now = self.clock()
        rec = self.recovery
        if not rec.in_recovery:
            self._reset(None)
            health.RECOVERY_REMAINING.set(0)
            return None
        lagging = self.lagging()
        health.RECOVERY_REMAINING.set(sum(h - o for h, o in lagging.values()))
        offsets = dict(rec.active_offsets)
        if self._progress_at is None or offsets != self._offsets:
            self._reset(now)
            self._offsets = offsets
        if not lagging:
            return None
        positions = await self.positions(sorted(lagging))
        if self._skip_gaps(lagging, positions):
            return "gap_skipped"
        idle = now - (self._progress_at or now)
        if idle >= self.stall_s:
            await self._give_up(lagging, positions, idle)
            return "exit"
        if idle >= self.stall_s / 2 and not self._reseeked:
            await self._reseek(lagging, positions)
            return "reseek"
        return None

    def _reset(self, now: float | None) -> None:
        self._progress_at, self._reseeked = now, False
        self._at_end.clear()

    def _skip_gaps(self, lagging: Mapping[TP, tuple[int, int]], positions: Mapping[TP, int | None]) -> bool:
        """Mark caught up the partitions with nothing left to fetch (position past the highwater) once the
        changelog queue stayed empty for two checks (every fetched record has been applied)."""
        queue_empty = self.app.tables.changelog_queue.empty()
        done: list[TP] = []
        for tp, (highwater, offset) in lagging.items():
            pos = positions.get(tp)
            if pos is not None and pos > highwater and queue_empty:
                self._at_end[tp] = self._at_end.get(tp, 0) + 1
                if self._at_end[tp] >= 2:
                    done.append(tp)
            else:
                self._at_end.pop(tp, None)
        if not done:
            return False
        rec = self.recovery
        for tp in done:
            highwater, offset = lagging[tp]
            log.warning("recovery_gap_skipped", topic=tp.topic, partition=tp.partition, highwater=highwater,
                        offset=offset, position=positions.get(tp),
                        reason="the changelog partition ends in records that are not data (transaction "
                               "marker or gap); nothing is left to fetch")
            rec.active_offsets[tp] = highwater
            health.RECOVERY_ACTIONS.labels("gap_skipped").inc()
        if not rec.need_recovery():
            # What Faust's own end-of-recovery check does (it runs only when a record or a 5 s timeout
            # wakes its changelog reader).
            rec.flush_buffers()
            rec._set_recovery_ended()
            rec.signal_recovery_end.set()
        return True

    async def _reseek(self, lagging: Mapping[TP, tuple[int, int]], positions: Mapping[TP, int | None]) -> None:
        self._reseeked = True
        targets = {tp: max(offset, 0) for tp, (_, offset) in lagging.items()}
        log.warning("recovery_reseek", partitions=_describe(lagging, positions),
                    reason=f"no changelog record applied for {self.stall_s / 2:.0f} s")
        health.RECOVERY_ACTIONS.labels("reseek").inc()
        consumer = self.app.consumer
        try:
            await consumer.seek_wait(targets)
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


class _WatchdogService(mode.Service):
    """Runs the checks from the app's start (Faust's ``app.task`` would start only after the first
    recovery, the one that may hang)."""

    def __init__(self, dog: RecoveryWatchdog, interval_s: float, **kwargs: Any) -> None:
        self.dog, self.interval_s = dog, interval_s
        super().__init__(**kwargs)

    @mode.Service.task
    async def _watch(self) -> None:
        while not self.should_stop:
            await self.sleep(self.interval_s)
            try:
                await self.dog.check()
            except Exception as e:  # noqa: BLE001 - the watchdog must not die of one bad look
                log.error("recovery_watchdog_failed", error=f"{type(e).__name__}: {e}", exc_info=True)


def install_recovery_watchdog(app: faust.App, stall_s: float, interval_s: float = 1.0) -> RecoveryWatchdog:
    """Start a :class:`RecoveryWatchdog` with the app (every worker; call before the app starts)."""
    dog = RecoveryWatchdog(app, stall_s)
    app.add_dependency(_WatchdogService(dog, interval_s))
    return dog
