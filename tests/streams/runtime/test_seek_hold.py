"""The worker's consumer loop across Faust's "seek to the committed offsets, then resume the flow".

Faust's recovery seeks the stream partitions to their committed offsets and then resumes the app's
flow control, which clears every stream queue. A record fetched from the sought position and
delivered in between was cleared with the queue while the fetch position was already past it: lost
(the flaky SIGKILL test of tests/streams/agents/test_integration.py). Here the real loop
(``DrainConsumer._drain_messages``) runs against one partition held in memory.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any, AsyncIterator

from faust.types import TP as FaustTP
from mode import Service

from opsloop.streams.runtime.delivery import DrainConsumer

TP = FaustTP("telemetry.iptables", 2)
COMMITTED = 5


class OnePartition(DrainConsumer):
    """DrainConsumer over one partition of records 5..9 in memory: a fetch hands out the record at the
    fetch position (when ``fetch_allowed`` is set) and moves the position on, as a consumer does."""

    def __init__(self) -> None:   # mode's Service only: none of Faust's Kafka consumer
        Service.__init__(self)
        self.position = COMMITTED
        self.fetch_allowed = asyncio.Event()
        self.queue: list[int] = []   # the stream queue the records are delivered into
        self.callback = self._to_queue
        self._read_offset = defaultdict(lambda: None)
        self._committed_offset: dict[Any, int | None] = {}
        self._commit_every = None
        self._n_acked = 0
        self.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True))
        self.transport = SimpleNamespace(app=SimpleNamespace(should_stop=False))
        self.flow_active = True
        self.can_resume_flow = asyncio.Event()
        self.suspend_flow = asyncio.Event()

    async def _to_queue(self, message: Any) -> None:
        self.queue.append(message.offset)

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[Any, Any]]:   # type: ignore[override]
        await self.fetch_allowed.wait()
        if self.position < 10:
            offset, self.position = self.position, self.position + 1
            yield TP, SimpleNamespace(topic=TP[0], offset=offset)
        else:
            await asyncio.sleep(0.001)

    async def seek_to_committed(self) -> dict[Any, int]:   # type: ignore[override]
        self.position = COMMITTED
        return {TP: COMMITTED}


def test_a_record_fetched_between_the_seek_and_the_resume_is_not_lost_with_the_cleared_queue() -> None:
    async def main() -> list[int]:
        c = OnePartition()
        fetcher = SimpleNamespace(_stopped=asyncio.Event())
        loop_task = asyncio.ensure_future(c._drain_messages(fetcher))
        # Faust's _resume_streams: seek to the committed offsets ...
        await c.perform_seek()
        # ... a fetch from the sought position comes in before the flow is resumed ...
        c.fetch_allowed.set()
        for _ in range(20):
            await asyncio.sleep(0)
        # ... then app.flow_control.resume() clears the stream queues, and the consumer's flow resumes.
        c.queue.clear()
        c.resume_flow()
        for _ in range(200):
            await asyncio.sleep(0)
            if len(c.queue) >= 5:
                break
        fetcher._stopped.set()
        loop_task.cancel()
        try:
            await loop_task
        except asyncio.CancelledError:
            pass
        return c.queue

    delivered = asyncio.run(main())
    # Every record from the committed offset on reaches the queue after the clear, in order.
    assert delivered == [5, 6, 7, 8, 9]
