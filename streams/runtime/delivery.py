"""Faust's consumer loop with one record delivered by a direct call instead of four tasks.

faust-streaming 0.15.3 (pinned) hands each fetched record to the topic's channels in
``Consumer._drain_messages`` by ``await self.wait_first(callback(message), self.suspend_flow.wait())``:
per record it creates four tasks (the delivery, the flow-suspension wait and the service's stopped
and crashed waits), runs ``asyncio.wait`` over them and cancels three. The delivery itself almost
never waits (it decodes raw bytes and puts the event on a queue with room), so that machinery was
most of Faust's per-record cost on the event loop (py-spy on the stream worker: the loop's own task
scheduling and ``wait_first`` together ~25 % of the main thread).

:func:`deliver` starts the delivery coroutine by hand. If it finishes without waiting, that is all;
if it has to wait (a full queue, flow control during a rebalance, a full producer buffer), the rest
of it runs exactly as Faust runs it: as a task raced against a flow suspension, so a rebalance still
abandons a delivery stuck behind a full queue. What is delivered, in which order, with which offsets
and acks, is unchanged; only the tasks around a delivery that never waits are gone.

**Nothing is delivered between a seek to the committed offsets and the flow's resume.** After a
rebalance Faust's recovery seeks the stream partitions to their committed offsets
(``Consumer.perform_seek``) and then resumes the app's flow control, which *clears every stream
queue*. A record fetched from the sought position and delivered in between was thrown away with
the queue while the consumer's position was already past it: lost until the next rebalance. Seen
as a flaky ``test_unprotected_port_pages_and_state_survives_sigkill`` (the firewall round after the
restart never processed, the anomaly record of the same produce processed); with the window widened
by hand (a 0.5 s stall after the seek) the worker's log showed both records delivered after the
seek and then discarded by the clear. So a seek holds the deliveries until the flow resumes; the
records fetched meanwhile are dropped and fetched again after a second seek, made once the queues
are cleared (at-least-once: a record handed over before the hold may come twice, as it did before).
A partition with no committed offset is sought back too, to where a new assignment starts it
(``transport.seek_to_committed``): aiokafka's own seek left it past the dropped records.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable, Coroutine, Generator, cast

from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as driver
from mode import Service


class _Resume:
    """The rest of a coroutine that was started by hand and is suspended on ``waiting_on``.

    Awaiting it hands what the coroutine waits on to the awaiting task, as ``await coroutine``
    would have from the start (a cancellation is thrown into the coroutine, as a task does)."""

    __slots__ = ("_coro", "_waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting_on: Any) -> None:
        self._coro, self._waiting_on = coro, waiting_on

    def __await__(self) -> Generator[Any, None, Any]:
        coro, waiting_on = self._coro, self._waiting_on
        while True:
            try:
                yield waiting_on
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - a cancellation or error for the coroutine
                try:
                    waiting_on = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    waiting_on = coro.send(None)
                except StopIteration as stop:
                    return stop.value


async def deliver(service: Service, delivery: Coroutine[Any, Any, Any], suspend_flow: asyncio.Event) -> None:
    """Run ``delivery`` (Faust's per-record callback); race it against ``suspend_flow`` only if it waits."""
    try:
        waiting_on = delivery.send(None)
    except StopIteration:
        return   # delivered without waiting: the common case
    await service.wait_first(_Resume(delivery, waiting_on), suspend_flow.wait())


class DrainConsumer(driver.Consumer):
    """Faust's aiokafka consumer with :func:`deliver` in its per-record loop and deliveries held from a
    seek to the committed offsets until the flow resumes (module docstring)."""

    _flow_resumed: asyncio.Event | None = None   # clear from a seek until the flow resumes

    def _resumed(self) -> asyncio.Event:
        if self._flow_resumed is None:
            self._flow_resumed = asyncio.Event()
            self._flow_resumed.set()
        return self._flow_resumed

    async def perform_seek(self) -> None:
        self._resumed().clear()   # before the seek: a fetch from the new position must wait too
        await super().perform_seek()

    def resume_flow(self) -> None:
        # Faust resumes the app's flow control (clearing the stream queues) before the consumer's
        super().resume_flow()
        self._resumed().set()

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - exercised by every worker test
        # faust-streaming 0.15.3 Consumer._drain_messages, the delivery line changed (see deliver)
        callback = cast(Callable[[Any], Coroutine[Any, Any, Any]], self.callback)
        getmany = self.getmany
        consumer_should_stop = cast(Service, self)._stopped.is_set
        fetcher_should_stop = cast(Service, fetcher)._stopped.is_set

        get_read_offset = self._read_offset.__getitem__
        set_read_offset = self._read_offset.__setitem__
        set_flag = self.diag.set_flag
        unset_flag = self.diag.unset_flag
        commit_every = self._commit_every
        acks_enabled_for = self.app.topics.acks_enabled_for
        suspend_flow = self.suspend_flow
        flow_resumed = self._resumed()

        yield_every = 100
        num_since_yield = 0
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                set_flag(CONSUMER_FETCHING)
                ait = cast(AsyncIterator, getmany(timeout=1.0))
                await self.sleep(0)
                if not self.should_stop:
                    async for tp, message in ait:
                        num_since_yield += 1
                        if num_since_yield > yield_every:
                            await sleep(0)
                            num_since_yield = 0
                        if not flow_resumed.is_set():
                            # A seek happened and the queues are about to be cleared: wait for that,
                            # then fetch again from the committed offsets (module docstring).
                            if await self.wait_for_stopped(flow_resumed):
                                break
                            await super().perform_seek()
                            break
                        offset = message.offset
                        r_offset = get_read_offset(tp)
                        if r_offset is None or offset >= r_offset:
                            gap = offset - (r_offset or 0)
                            if gap > 1 and r_offset:
                                if acks_enabled_for(message.topic):
                                    await self._add_gap(tp, r_offset + 1, offset)
                            if commit_every is not None:
                                if self._n_acked >= commit_every:
                                    self._n_acked = 0
                                    await self.commit()
                            await deliver(self, callback(message), suspend_flow)
                            set_read_offset(tp, offset)
                        else:
                            self.log.dev("DROPPED MESSAGE ROFF %r: k=%r v=%r", offset, message.key, message.value)
                    unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            unset_flag(CONSUMER_FETCHING)
