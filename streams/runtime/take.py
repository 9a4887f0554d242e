"""Batches from a Faust stream whose time window widens while the agent is behind.

Faust's ``Stream.take_events(max_, within)`` waits a fixed ``within`` for a batch to fill. Under a
backlog the batch fills only as fast as Faust's per-record path feeds it, so a short window gives
small batches, and every batch pays the per-batch costs again: above all each touched state key is
written to the changelog once per batch (a fleet's round touches ~1,100 keys of 1.5–2.7 kB). A long
window, on the other hand, delays every finding when the worker is caught up.

:func:`take_batches` therefore picks the window per batch: ``within`` while the partitions of the
last batch were caught up, ``backlog_within`` while at least one more full batch was already waiting
behind it (then the records wait anyway, and a larger batch drains them sooner). The loop is Faust's
``take_events`` (faust-streaming 0.15.3, pinned) with that one change: the same processor fills the
buffer, events are acked after the caller is done with a batch, never more than ``max_`` at a time.

The buffer is filled by :func:`_feed`, Faust's passive stream drainer (its Cython ``StreamIterator``)
with one change: Faust yields to the event loop (``asyncio.sleep(0)``) before *every* event, a full
loop round per record; the feed yields every :data:`YIELD_EVERY` events taken without waiting, as
Faust's own consumer loop does between deliveries. The rest is Faust's: events of an older consumer
generation or taken while the flow is suspended (a rebalance) are skipped, messages are tracked as
unacked, the stream sensors and the current event are set, the stream's processors run.

Events whose consumer generation ended while they waited in the buffer (a rebalance) are dropped at hand-over,
not acked (Faust's rule, applied once more), and a batch taken across a pause after which the worker is no
longer a member of its group (frozen past the session timeout) is dropped whole:
``streams/runtime/membership.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncGenerator, Callable, Optional, Sequence

import faust
from faust.exceptions import Skip
from faust.types import TP, ChannelT, EventT
from mode.utils.futures import maybe_async, notify

from opsloop.log import get_logger
from opsloop.streams.runtime import membership
from opsloop.streams.runtime.health import HANDED_OFF

log = get_logger("stream.take")

Lag = Callable[[TP, int], Optional[int]]   # records behind ``offset`` in ``tp``, None when unknown
YIELD_EVERY = 100   # events taken in a row before the feed lets other tasks run (Faust's consumer loop: 100)


def behind(events: Sequence[EventT], lag: Lag) -> int:
    """Records already waiting after ``events`` in their partitions (the newest offset of each)."""
    newest: dict[TP, int] = {}
    for e in events:
        m = e.message
        if m.offset > newest.get(m.tp, -1):
            newest[m.tp] = m.offset
    total = 0
    for tp, offset in newest.items():
        got = lag(tp, offset)
        if got:
            total += got
    return total


def next_window(events: Sequence[EventT], lag: Lag, max_: int, within: float, backlog_within: float) -> float:
    """The window for the batch after ``events``: ``backlog_within`` when a full batch already waits."""
    return backlog_within if behind(events, lag) >= max_ else within


def consumer_lag(app: faust.App) -> Lag:
    def lag(tp: TP, offset: int) -> int | None:
        try:
            hw = app.consumer.highwater(tp)
        except Exception:  # noqa: BLE001 - not assigned yet / no fetch yet
            return None
        return None if hw is None else max(0, hw - offset - 1)
    return lag


def take_batches(stream: faust.StreamT, max_: int, within: float, backlog_within: float,
                 lag: Lag) -> AsyncGenerator[list[EventT], None]:
    """:func:`_take_batches`, registered with the stream like Faust's own buffering generators, so
    that stopping the stream finalises it (acks, processor removed) even if the caller abandoned it."""
    agen = _take_batches(stream, max_, within, backlog_within, lag)
    active = getattr(stream, "_active_agens", None)
    if active is not None:
        active.add(agen)
    return agen


async def _take_batches(stream: faust.StreamT, max_: int, within: float, backlog_within: float,
                        lag: Lag) -> AsyncGenerator[list[EventT], None]:
    """Like ``stream.take_events(max_, within)``, with ``backlog_within`` as the window after a batch
    that left at least ``max_`` records waiting in its partitions."""
    s: Any = stream
    guard: membership.MembershipGuard | None = getattr(getattr(s, "app", None), membership.GUARD_ATTR, None)
    buffer: list[Any] = []
    events: list[EventT] = []
    buffer_full = asyncio.Event()
    buffer_consumed = asyncio.Event()
    timeout = within
    stream_enable_acks: bool = s.enable_acks
    buffer_consuming: asyncio.Future | None = None
    channel_it = s.channel.__aiter__()

    async def add_to_buffer(value: Any) -> Any:
        nonlocal buffer_consuming
        try:
            if buffer_consuming is not None:
                try:
                    await buffer_consuming
                finally:
                    buffer_consuming = None
            buffer.append(value)
            event = s.current_event
            if event is None:
                raise RuntimeError("take buffer found current_event is None")
            events.append(event)
            if len(buffer) >= max_:
                buffer_full.set()
                buffer_consumed.clear()
                await s.wait(buffer_consumed)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - as Faust's take_events: crash the stream, loudly
            s.log.exception("Error adding to take buffer: %r", exc)
            await s.crash(exc)
        return value

    s.enable_acks = False   # events are acked below, once the caller is done with their batch
    s.add_processor(add_to_buffer)
    if isinstance(s.channel, ChannelT) and not s._passive:
        s._passive = True
        s.add_future(_feed(s, channel_it))
    else:   # not a Kafka channel (never in the worker): Faust's own drainer
        s._enable_passive(channel_it)
    try:
        while not s.should_stop:
            await s.wait_for_stopped(buffer_full, timeout=timeout)
            if not buffer:
                continue
            buffer_consuming = s.loop.create_future()
            handed: list[EventT] = []
            try:
                handed = await _admitted(s, guard, events)
                if handed:
                    yield handed
            finally:
                timeout = next_window(events, lag, max_, within, backlog_within)
                buffer.clear()
                kept = {id(e) for e in handed}   # emptied by the agent (leave_unacked): none acked
                for event in events:
                    if id(event) in kept:
                        await s.ack(event)
                    else:
                        _release(s, event)
                events.clear()
                notify(buffer_consuming)
                buffer_full.clear()
                buffer_consumed.set()
    finally:
        s.enable_acks = stream_enable_acks
        s._processors.remove(add_to_buffer)


async def _admitted(s: Any, guard: membership.MembershipGuard | None, events: list[EventT]) -> list[EventT]:
    """The events of a batch its agent may have: those of the consumer generation still current (as
    Faust's own take: a rebalance since they were taken sends their partitions back to the committed
    offset, to this worker or another), and none when the guard finds this worker out of that generation."""
    current = s.app.consumer_generation_id
    fresh = [e for e in events if _generation(e) in (None, current)]
    if len(fresh) < len(events):
        HANDED_OFF.labels(reason="rebalanced").inc(len(events) - len(fresh))
        log.info("batch_dropped", records=len(events) - len(fresh), reason="taken before a rebalance; read "
                 "again from the committed offset by the partitions' owner")
    if fresh and guard is not None and not await guard.admit(current):
        HANDED_OFF.labels(reason="evicted").inc(len(fresh))
        log.warning("batch_dropped", records=len(fresh), reason="no longer a member of the group after a "
                    "pause; the partitions' new owner handles these records")
        return []
    return fresh


def leave_unacked(batch: list[EventT]) -> None:
    """Hand ``batch`` (the list :func:`take_batches` yielded) back undone: its events are released, not acked,
    so no commit passes them and a restart or the partitions' next owner reads them again. For a worker that
    is stopping or whose producer died: while it runs, an unacked offset would hold every later commit."""
    batch.clear()


def _generation(event: EventT) -> int | None:
    return getattr(event.message, "generation_id", None)


def _release(s: Any, event: EventT) -> None:
    """Done with an event that was not handed out, without counting its offset as processed: it belongs to
    a generation that is over (an ack would put an old offset into the next assignment's commits)."""
    message = event.message
    message.acked = True
    s.app.consumer._unacked_messages.discard(message)
    s._on_stream_event_out(message.tp, message.offset, s, event)   # the sensors' events in and out stay paired


async def _feed(s: Any, channel_it: Any) -> None:
    """Faust's ``Stream._passive_drainer`` over its Cython ``StreamIterator`` (faust-streaming 0.15.3),
    yielding to the loop every :data:`YIELD_EVERY` events instead of before each (module docstring)."""
    try:
        s._passive_started.set()
        try:
            await _feed_events(s)
        except BaseException as exc:   # as Faust: to the channel's subscribers
            await channel_it.throw(exc)
    finally:
        s._channel_stop_iteration(channel_it)
        s._passive = False


async def _feed_events(s: Any) -> None:
    app = s.app
    channel = s.channel
    queue = channel.queue
    errors = queue._errors
    slow_get = channel.__anext__
    flow_active = app.flow_control.is_active
    acking_topics = app.topics._acking_topics
    add_unacked = app.consumer._unacked_messages.add
    on_message_in, on_stream_event_in = s._on_message_in, s._on_stream_event_in
    set_current_event = s._set_current_event
    processors = s._processors
    s._finalized = True
    started_here = await s.maybe_start()
    in_a_row = 0
    try:
        while not s.should_stop:
            if errors:
                raise errors.popleft()
            if queue.empty():
                in_a_row = 0
                item = await slow_get()
            else:
                item = queue.get_nowait()
                in_a_row += 1
                if in_a_row >= YIELD_EVERY:
                    in_a_row = 0
                    await asyncio.sleep(0)
            if not isinstance(item, EventT):   # never on a topic's channel; as Faust: a bare value
                set_current_event(None)
                if await _process(s, processors, item):
                    s.events_total += 1
                continue
            message = item.message
            if not flow_active() or message.generation_id != app.consumer_generation_id:
                continue   # a rebalance began or this event predates it: Faust drops it, unacked
            tp, offset = message.tp, message.offset
            if message.topic in acking_topics and not message.tracked:
                message.tracked = True
                add_unacked(message)
                on_message_in(tp, offset, message)
            on_stream_event_in(tp, offset, s, item)
            set_current_event(item)
            try:
                if await _process(s, processors, item.value):
                    s.events_total += 1
                else:
                    await s.ack(item)   # skipped by a processor: acked at once, as Faust does
            finally:
                s.current_event = None
    finally:
        if started_here:
            await s.stop()
            s.service_reset()


async def _process(s: Any, processors: Sequence[Callable[[Any], Any]], value: Any) -> bool:
    """Run the stream's processors on ``value``; False when one of them skipped it."""
    try:
        for processor in processors:
            value = await maybe_async(processor(value))
        await s.on_merge(value)
    except Skip:
        return False
    return True
