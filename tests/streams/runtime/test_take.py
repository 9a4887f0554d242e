"""The batch window: short while an agent is caught up, long while a full batch already waits.

The loop itself (``take_batches``) runs in every agent of the integration tests
(tests/streams/agents/test_integration.py, tests/scale/test_scale_out.py): acks, restore after a kill.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from faust.types import TP

from opsloop.config import ConfigError, load_settings
from opsloop.streams.runtime.take import behind, next_window

A, B = TP("telemetry.ipmi", 0), TP("telemetry.ipmi", 1)


@dataclass
class _Msg:
    tp: TP
    offset: int


@dataclass
class _Event:
    message: _Msg


def _events(*pairs: tuple[TP, int]) -> list[_Event]:
    return [_Event(_Msg(tp, off)) for tp, off in pairs]


def test_behind_counts_what_waits_after_the_newest_offset_of_each_partition() -> None:
    highwater = {A: 100, B: 10}
    asked: list[tuple[TP, int]] = []

    def lag(tp: TP, offset: int) -> int | None:
        asked.append((tp, offset))
        return highwater[tp] - offset - 1

    events = _events((A, 5), (A, 9), (B, 3), (A, 7))
    assert behind(events, lag) == (100 - 9 - 1) + (10 - 3 - 1)
    assert sorted(asked) == [(A, 9), (B, 3)]   # once per partition, at its newest offset


def test_unknown_lag_counts_as_caught_up() -> None:
    assert behind(_events((A, 1)), lambda tp, off: None) == 0


@pytest.mark.parametrize(("waiting", "window"), [(0, 0.2), (1999, 0.2), (2000, 1.5), (50_000, 1.5)])
def test_the_long_window_needs_a_full_batch_waiting(waiting: int, window: float) -> None:
    assert next_window(_events((A, 0)), lambda tp, off: waiting, 2000, 0.2, 1.5) == window


def test_backlog_window_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="batch_backlog_within_s"):
        load_settings(None, {"stream": {"data_dir": str(tmp_path), "batch_backlog_within_s": 0}})


def test_the_feed_takes_events_of_the_current_generation_and_drops_older_ones_unacked(tmp_path: Path) -> None:
    # take_batches fills its buffer with its own feed (Faust's drainer without a loop round per event);
    # it must keep Faust's rebalance rule: an event fetched before the last rebalance is dropped, not
    # handed to the agent, and not acked (its partition's new owner reads it from the committed offset).
    import asyncio

    import faust
    from faust.types.tuples import ConsumerMessage

    from opsloop.streams.runtime.app import create_app
    from opsloop.streams.runtime.take import YIELD_EVERY, take_batches

    app = create_app(load_settings(None, {"stream": {"data_dir": str(tmp_path / "streams")}}), app_id="t-feed")

    async def main() -> tuple[list[int], list[bool], int]:
        app.flow_control.resume()
        app.consumer_generation_id = 7
        channel = app.channel(maxsize=1000)
        stream = app.stream(channel)
        n = YIELD_EVERY + 5   # past one yield to the loop
        events = []
        for i in range(n):
            msg = ConsumerMessage("telemetry.ipmi", 0, i, 0.0, 0, [], b"k", b"v%d" % i, None,
                                  generation_id=6 if i % 10 == 3 else 7)
            events.append(faust.Event(app, b"k", msg.value, {}, msg))
            await channel.put(events[-1])
        got: list[int] = []
        async for batch in take_batches(stream, n, 0.05, 0.05, lambda tp, off: None):
            got += [e.message.offset for e in batch]
            if len(got) >= n - n // 10 - 1:
                break
        await stream.stop()
        return got, [e.message.acked for e in events], stream.events_total

    got, acked, total = asyncio.run(main())
    stale = {i for i in range(YIELD_EVERY + 5) if i % 10 == 3}
    assert got == [i for i in range(YIELD_EVERY + 5) if i not in stale]   # in order, none stale
    assert [i for i, a in enumerate(acked) if a] == got                      # acked once handed out
    assert total == len(got)


def test_events_whose_generation_ended_while_they_waited_are_dropped_at_hand_over_and_not_committed(
        tmp_path: Path) -> None:
    # An event taken under generation 7 that is still in the buffer when a rebalance has moved the app to
    # generation 8 is not the agent's: its partition went back to the committed offset (to this worker or
    # another). It must not be handed over, nor acked into the new assignment's commits; events taken
    # under generation 8 are handed over and acked.
    import asyncio

    import faust
    from faust.types.tuples import ConsumerMessage

    from opsloop.streams.runtime.app import create_app
    from opsloop.streams.runtime.take import take_batches

    app = create_app(load_settings(None, {"stream": {"data_dir": str(tmp_path / "streams")}}), app_id="t-gen")

    def event(offset: int, generation: int) -> faust.Event:
        msg = ConsumerMessage("telemetry.ipmi", 0, offset, 0.0, 0, [], b"k", b"v", None, generation_id=generation)
        return faust.Event(app, b"k", msg.value, {}, msg)

    counted: list[int] = []   # offsets the consumer was told are processed (what its commits are made of)
    consumer_ack = app.consumer.ack

    def ack(message: ConsumerMessage) -> bool:
        counted.append(message.offset)
        return consumer_ack(message)
    app.consumer.ack = ack  # type: ignore[method-assign]

    async def main() -> tuple[list[list[int]], list[faust.Event]]:
        app.flow_control.resume()
        app.consumer_generation_id = 7
        channel = app.channel(maxsize=100)
        stream = app.stream(channel)
        old = [event(i, 7) for i in range(3)]
        new = [event(i, 8) for i in range(3, 5)]
        batches: list[list[int]] = []

        async def rebalance_then_more() -> None:
            for e in old:
                await channel.put(e)
            await asyncio.sleep(0.1)             # taken into the buffer, the window still open
            app.consumer_generation_id = 8       # a rebalance reached Faust
            await asyncio.sleep(0.4)
            for e in new:
                await channel.put(e)
        feeder = asyncio.ensure_future(rebalance_then_more())
        async for batch in take_batches(stream, 100, 0.3, 0.3, lambda tp, off: None):
            batches.append([e.message.offset for e in batch])
            if sum(map(len, batches)) >= len(new):
                break
        await feeder
        await stream.stop()
        return batches, old + new

    from opsloop.streams.runtime.health import HANDED_OFF
    before = HANDED_OFF.labels(reason="rebalanced")._value.get()
    batches, events = asyncio.run(main())
    assert HANDED_OFF.labels(reason="rebalanced")._value.get() - before == 3
    assert batches == [[3, 4]]
    assert all(e.message.acked for e in events)                      # nothing left for wait_empty to wait on
    assert sorted(counted) == [3, 4]                                  # only the handed events count
