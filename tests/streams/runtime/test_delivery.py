"""Faust's per-record delivery started by hand: no task when it does not wait, Faust's race when it does."""

from __future__ import annotations

import asyncio
from typing import Any

from mode import Service

from opsloop.streams.runtime.delivery import DrainConsumer, deliver


def _counting_tasks(loop: asyncio.AbstractEventLoop) -> list[Any]:
    made: list[Any] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task:
        made.append(coro)
        return asyncio.Task(coro, loop=loop, **kw)

    loop.set_task_factory(factory)
    return made


def test_a_delivery_that_does_not_wait_runs_to_its_end_without_a_task() -> None:
    async def main() -> tuple[list[str], list[Any]]:
        made = _counting_tasks(asyncio.get_running_loop())
        service, suspend, seen = Service(), asyncio.Event(), []

        async def delivery(i: int) -> None:
            lock = asyncio.Lock()
            async with lock:   # an uncontended lock, as Faust's conductor takes per record: no wait
                seen.append(f"r{i}")

        for i in range(3):
            await deliver(service, delivery(i), suspend)
        return seen, list(made)   # before asyncio.run's own shutdown tasks

    seen, made = asyncio.run(main())
    assert seen == ["r0", "r1", "r2"]
    assert made == []


def test_a_delivery_that_waits_finishes_with_the_value_it_waited_for() -> None:
    async def main() -> tuple[list[Any], int]:
        made = _counting_tasks(asyncio.get_running_loop())
        service, suspend, got = Service(), asyncio.Event(), []
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        queue.put_nowait(0)   # full: the delivery's put waits until the reader below takes one

        async def delivery() -> None:
            await queue.put(1)
            got.append(await asyncio.sleep(0, result="after"))

        async def reader() -> None:
            await asyncio.sleep(0.01)
            got.append(queue.get_nowait())

        task = asyncio.ensure_future(reader())
        await deliver(service, delivery(), suspend)
        await task
        got.append(queue.get_nowait())
        return got, len(made)

    got, tasks = asyncio.run(main())
    assert got == [0, "after", 1]
    assert tasks > 1   # it waited: raced as Faust races it (wait_first's tasks)


def test_a_delivery_stuck_behind_a_full_queue_is_abandoned_when_the_flow_is_suspended() -> None:
    # A rebalance suspends the flow: Faust abandons a delivery that waits for room, and so does deliver.
    async def main() -> list[str]:
        service, suspend, log = Service(), asyncio.Event(), []
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        queue.put_nowait(0)

        async def delivery() -> None:
            try:
                await queue.put(1)
                log.append("delivered")
            except asyncio.CancelledError:
                log.append("cancelled")
                raise

        asyncio.get_running_loop().call_later(0.01, suspend.set)
        await deliver(service, delivery(), suspend)
        await asyncio.sleep(0)   # let the cancellation reach the delivery
        log.append(f"queued {queue.qsize()}")
        return log

    assert asyncio.run(main()) == ["cancelled", "queued 1"]


def test_an_error_in_a_delivery_reaches_the_consumer_loop() -> None:
    async def main() -> None:
        async def bad() -> None:
            raise ValueError("decode failed")

        await deliver(Service(), bad(), asyncio.Event())

    try:
        asyncio.run(main())
    except ValueError as e:
        assert "decode failed" in str(e)
    else:
        raise AssertionError("the error was swallowed")


def test_the_consumer_loop_copied_from_faust_is_still_faust_s_loop() -> None:
    # DrainConsumer._drain_messages is faust-streaming 0.15.3's with one line changed; an upgrade that
    # changes Faust's must be read again before it is taken.
    import hashlib
    import inspect

    from faust.transport.consumer import Consumer

    faust_loop = hashlib.sha256(inspect.getsource(Consumer._drain_messages).encode()).hexdigest()[:16]
    assert faust_loop == "44a2500309e83c63"
    assert DrainConsumer._drain_messages is not Consumer._drain_messages
