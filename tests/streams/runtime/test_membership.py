"""The membership guard's decisions (streams/runtime/membership.py) on a simulated clock and heartbeat;
the real freeze with two workers and a broker: tests/scale/test_worker_freeze.py."""

from __future__ import annotations

import asyncio
from typing import Any

from opsloop.streams.runtime.membership import MembershipGuard


class Guard(MembershipGuard):
    """The guard with its heartbeat answers scripted (True member, False evicted, None no answer)."""

    def __init__(self, answers: list[bool | None]) -> None:
        self.now = 100.0
        super().__init__(app=None, stall_s=3.0, session_timeout_s=6.0, clock=lambda: self.now)
        self.answers = answers
        self.asked = 0

    async def heartbeat(self, generation: int | None) -> bool | None:
        self.asked += 1
        self.now += 1.0            # each unanswered ask costs time: the session deadline comes
        return self.answers.pop(0) if self.answers else None


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_no_pause_no_question() -> None:
    g = Guard([False])
    g._note(0.05)
    assert not g.in_doubt() and run(g.admit(4)) is True and g.asked == 0


def test_a_pause_longer_than_the_heartbeat_interval_is_checked_once() -> None:
    g = Guard([True])
    g._note(4.0)                                     # the ticker saw the loop stand still for 4 s
    assert g.in_doubt() and g.pauses == 1
    assert run(g.admit(4)) is True and g.asked == 1
    assert not g.in_doubt() and run(g.admit(4)) is True and g.asked == 1   # confirmed: not asked again


def test_evicted_after_a_pause_drops_the_batch() -> None:
    g = Guard([False])
    g._note(30.0)
    assert run(g.admit(4)) is False


def test_a_pause_going_on_now_counts_before_the_ticker_notices_it() -> None:
    g = Guard([False])
    g._note(0.0)
    g.now += 20.0                                    # resumed: the batch is looked at before the ticker runs
    assert g.in_doubt() and run(g.admit(4)) is False


def test_no_answer_for_a_whole_session_counts_as_out_an_answer_in_time_as_in() -> None:
    silent = Guard([])
    silent._note(10.0)
    assert run(silent.admit(4)) is False and silent.asked >= 6
    late = Guard([None, None, True])
    late._note(10.0)
    assert run(late.admit(4)) is True and late.asked == 3


def test_a_generation_found_lost_stays_lost_for_every_later_batch_of_it() -> None:
    # CI: after the freeze the consumer thread kept fetching for the old assignment until the rejoin reached
    # Faust; the batch after the dropped one was handed over (asked nothing: no new pause) and published
    # two "cleared" findings from the stale view.
    g = Guard([False])
    g._note(30.0)
    assert run(g.admit(4)) is False and g.asked == 1
    assert not g.in_doubt()
    assert run(g.admit(4)) is False and g.asked == 1     # the same generation: dropped without asking
    assert run(g.admit(5)) is True and g.asked == 1      # the new assignment's batches go to the agent


class FakeCoordinator:
    def __init__(self, member_id: str, generation: int, answer: bool) -> None:
        self.member_id, self.generation, self.answer = member_id, generation, answer

    async def _do_heartbeat(self) -> bool:
        return self.answer


class FakeThread:
    def __init__(self, coordinator: FakeCoordinator) -> None:
        self.coordinator = coordinator

    def _ensure_consumer(self) -> Any:
        return type("C", (), {"_coordinator": self.coordinator})()

    async def call_thread(self, fn: Any) -> Any:
        return await fn()


def real_heartbeat(coordinator: FakeCoordinator, generation: int) -> bool | None:
    app = type("App", (), {"consumer": type("Consumer", (), {"_thread": FakeThread(coordinator)})()})()
    guard = MembershipGuard(app, stall_s=3.0, session_timeout_s=6.0)
    return run(guard.heartbeat(generation))


def test_a_coordinator_that_rejoined_since_the_batch_was_taken_is_not_its_member() -> None:
    # aiokafka's own heartbeat routine can hear "unknown member" and rejoin before the batch is looked at:
    # the coordinator then answers heartbeats for a new member and generation the batch knows nothing of.
    assert real_heartbeat(FakeCoordinator("m-new", 5, True), generation=4) is False
    assert real_heartbeat(FakeCoordinator("m-1", 4, True), generation=4) is True
    assert real_heartbeat(FakeCoordinator("", -1, True), generation=4) is False         # evicted, not rejoined
    assert real_heartbeat(FakeCoordinator("m-1", 4, False), generation=4) is None       # no answer: ask again
