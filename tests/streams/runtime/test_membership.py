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

    async def heartbeat(self) -> bool | None:
        self.asked += 1
        self.now += 1.0            # each unanswered ask costs time: the session deadline comes
        return self.answers.pop(0) if self.answers else None


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_no_pause_no_question() -> None:
    g = Guard([False])
    g._note(0.05)
    assert not g.in_doubt() and run(g.still_member()) is True and g.asked == 0


def test_a_pause_longer_than_the_heartbeat_interval_is_checked_once() -> None:
    g = Guard([True])
    g._note(4.0)                                     # the ticker saw the loop stand still for 4 s
    assert g.in_doubt() and g.pauses == 1
    assert run(g.still_member()) is True and g.asked == 1
    assert not g.in_doubt() and run(g.still_member()) is True and g.asked == 1   # confirmed: not asked again


def test_evicted_after_a_pause_drops_the_batch() -> None:
    g = Guard([False])
    g._note(30.0)
    assert run(g.still_member()) is False


def test_a_pause_going_on_now_counts_before_the_ticker_notices_it() -> None:
    g = Guard([False])
    g._note(0.0)
    g.now += 20.0                                    # resumed: the batch is looked at before the ticker runs
    assert g.in_doubt() and run(g.still_member()) is False


def test_no_answer_for_a_whole_session_counts_as_out_an_answer_in_time_as_in() -> None:
    silent = Guard([])
    silent._note(10.0)
    assert run(silent.still_member()) is False and silent.asked >= 6
    late = Guard([None, None, True])
    late._note(10.0)
    assert run(late.still_member()) is True and late.asked == 3
