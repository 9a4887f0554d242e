"""Membership guard: a worker that was paused does not act on records it may no longer own.

What was seen (``tests/scale/test_worker_freeze.py``; faust-streaming 0.15.3, aiokafka 0.14): a worker
frozen (SIGSTOP: a paused VM, a GC or swap storm, a hung disk) for longer than the session timeout is
dropped from the group and its partitions go to another worker, which replays the records it had not
committed. When the frozen worker resumes, the batch it had fetched before the pause is still in its
take buffer, and its agent handled it at once, a few milliseconds after its first heartbeat came back
"unknown member": the findings of that batch were published a second time (``opened`` twice). The
broker fences its offset commits (generation gone), but nothing fences what it produces. Faust drops
events of an older generation only as it takes them, and no rebalance had reached Faust yet.

The guard: a ticker on the worker's event loop notes every pause of the loop longer than
``stall_s`` (the heartbeat interval: a shorter pause cannot cost the session). Before a batch taken
across such a pause is handed to its agent (``streams/runtime/take.py``), the guard sends a heartbeat
on the consumer's thread: a member (or a group rebalancing, whose revocation follows) gets the batch
as always; a member the coordinator no longer knows (unknown member, stale generation) drops the batch
unpublished (its records are the new owner's, which replays them from the last commit) and logs
``batch_dropped`` (the pause itself: ``worker_paused``); no answer from the coordinator for a session
timeout counts as not a member (the broker has not heard from us for as long either).

The verdict holds for the consumer generation the batch was taken under, not for one batch: after the
freeze the consumer thread goes on fetching for the assignment it had until the rejoin reaches Faust
(about a second), and every agent's take loop asks the one guard. Once the first batch was dropped,
the next one (10 ms later in a local run) found the pause already confirmed and was handed over: a CI
run published two ``cleared`` findings from the stale view. So a generation found lost stays
lost (every later batch of it is dropped without asking again), and a coordinator that has already
rejoined under a newer generation than the batch's is a verdict of "out" as well.

Not covered (at-least-once without transactions): a pause *inside* a batch, after its findings were
sent and before its state was written or its offsets committed. The new owner replays that batch from
the last commit with the state the changelog holds, and publishes its findings again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import faust
import mode

from opsloop.log import get_logger

log = get_logger("stream.membership")

GUARD_ATTR = "opsloop_membership"   # the app's guard, read by take_batches
UNKNOWN_MEMBER_ID = ""              # aiokafka's JoinGroupRequest.UNKNOWN_MEMBER_ID, set on eviction
DEFAULT_GENERATION_ID = -1          # aiokafka's OffsetCommitRequest.DEFAULT_GENERATION_ID, ditto


class MembershipGuard(mode.Service):
    """See the module docstring. ``heartbeat`` is injectable for tests: True member, False evicted,
    None no answer."""

    def __init__(self, app: Any, stall_s: float, session_timeout_s: float, tick_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, **kwargs: Any) -> None:
        self.app, self.stall_s, self.session_timeout_s, self.tick_s = app, stall_s, session_timeout_s, tick_s
        self.clock = clock
        self.pauses = 0             # loop pauses longer than stall_s seen so far
        self._confirmed = 0         # pauses covered by the last confirmation
        self._lost: set[int | None] = set()   # consumer generations this worker was found out of
        self._last_tick = clock()
        super().__init__(**kwargs)

    @mode.Service.task
    async def _tick(self) -> None:
        while not self.should_stop:
            before = self.clock()
            await self.sleep(self.tick_s)
            self._note(self.clock() - before - self.tick_s)

    def _note(self, pause: float) -> None:
        self._last_tick = self.clock()
        if pause > self.stall_s:
            self.pauses += 1
            log.warning("worker_paused", paused_s=round(pause, 1),
                        action="membership confirmed with the coordinator before the next batch")

    def in_doubt(self) -> bool:
        """A pause since the last confirmation, or one going on now (the ticker has not run since)."""
        return self.pauses != self._confirmed or self.clock() - self._last_tick > self.stall_s + self.tick_s

    async def heartbeat(self, generation: int | None) -> bool | None:
        """Is this worker still the member that took a batch under consumer ``generation``?"""
        try:
            thread = self.app.consumer._thread
            coordinator = thread._ensure_consumer()._coordinator

            def out() -> bool:   # evicted (the heartbeat routine heard it), or rejoined since the batch
                return (coordinator.member_id == UNKNOWN_MEMBER_ID or coordinator.generation == DEFAULT_GENERATION_ID
                        or (generation is not None and coordinator.generation != generation))
            if out():
                return False
            if await asyncio.wait_for(thread.call_thread(coordinator._do_heartbeat), self.stall_s):
                return not out()   # "rebalancing" answers True: a member, its revocation follows
            return False if out() else None
        except Exception as e:  # noqa: BLE001 - no answer this time: asked again until the session would end
            log.warning("membership_check_failed", error=f"{type(e).__name__}: {e}")
            return None

    async def admit(self, generation: int | None) -> bool:
        """May a batch taken under consumer ``generation`` go to its agent? True unless that generation is
        known lost, or a pause happened and the coordinator says (or lets us assume) we are out of it."""
        if generation in self._lost:
            return False
        if not self.in_doubt():
            return True
        pauses = self.pauses
        deadline = self.clock() + self.session_timeout_s
        while (member := await self.heartbeat(generation)) is None and self.clock() < deadline:
            await asyncio.sleep(min(0.5, self.tick_s * 5))
        self._confirmed, self._last_tick = pauses, self.clock()
        if not member:
            self._lost.add(generation)   # the records still coming for it are the new owner's as well
        return bool(member)


def install_membership_guard(app: faust.App, stall_s: float, session_timeout_s: float) -> MembershipGuard:
    """Start a :class:`MembershipGuard` with the app, for :func:`take_batches` (call before the app starts)."""
    guard = MembershipGuard(app, stall_s, session_timeout_s)
    setattr(app, GUARD_ATTR, guard)
    app.add_dependency(guard)
    return guard
