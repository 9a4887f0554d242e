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
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncGenerator, Callable, Optional, Sequence

import faust
from faust.types import TP, EventT
from mode.utils.futures import notify

Lag = Callable[[TP, int], Optional[int]]   # records behind ``offset`` in ``tp``, None when unknown


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
    s._enable_passive(channel_it)
    try:
        while not s.should_stop:
            await s.wait_for_stopped(buffer_full, timeout=timeout)
            if not buffer:
                continue
            buffer_consuming = s.loop.create_future()
            try:
                yield list(events)
            finally:
                timeout = next_window(events, lag, max_, within, backlog_within)
                buffer.clear()
                for event in events:
                    await s.ack(event)
                events.clear()
                notify(buffer_consuming)
                buffer_full.clear()
                buffer_consumed.set()
    finally:
        s.enable_acks = stream_enable_acks
        s._processors.remove(add_to_buffer)
