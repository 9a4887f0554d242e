"""Faust's Kafka transport: the worker consumer's fetch wait from our settings, and "seek to the committed
offsets" that also rewinds a stream partition with nothing committed yet.

**Fetch wait.** faust-streaming 0.15 creates the worker's aiokafka consumer with ``fetch_max_wait_ms=1500``,
fixed. aiokafka keeps one fetch request in flight per broker and only fetches partitions whose records it
has handed out, so as soon as one assigned partition is at its end, the broker holds that request
for up to 1.5 s and the partitions that still have records wait behind it. A backlog is then read in
bursts with ~1 s pauses: the worker idled half the time in ``make bench`` (stream stage). A short
wait costs one empty fetch per ``fetch_max_wait_ms`` per broker on an idle topic, nothing more.

**Seek to committed.** Faust's answer to every record it may have dropped around a rebalance (fetched
before the seek of its recovery and cleared with the stream queues when the flow resumes, dropped by
the seek hold of ``delivery.py``, cut off by ``getmany`` when the flow stopped) is ``perform_seek``:
back to the committed offsets. aiokafka's ``seek_to_committed`` seeks only partitions whose committed
offset is above 0 and leaves the others where they are. A stream partition with no commit (a worker
killed before its first commit, a group that never consumed that partition, a quiet topic) kept its
position past the dropped records: lost until the next rebalance, the worker idle and silent.
Seen as ``tests/streams/test_restart_after_kill_consumes.py``, 2 restarts in 14 handled nothing:
every telemetry partition uncommitted, position at the highwater, no batch. :func:`seek_to_committed`
resets such a partition to where a fresh assignment starts it (``auto_offset_reset``, ``earliest``
here): the uncommitted records are read again, as after a crash (at-least-once). Changelog partitions
are left alone, as before (their offsets are the table recovery's, never committed), and so is Faust's
leader-election topic ``<app id>-__assignor-__leader`` (:func:`faust_leader_topic`: every worker is assigned
it, nothing commits it, no records of ours): it was reset at every seek, a needless request and a topic in
every ``uncommitted_partitions_reset`` line.

**A refused commit.** A commit the group refuses (this member's generation ended: frozen past the session
timeout, a rebalance under way) comes back False from Faust's ``_commit``, unsaid, and Faust still records its
offsets as committed (``Consumer._commit_offsets``). A revocation clears that record, but a commit in flight
during it (the revocation's ``wait_empty`` waits for it) writes it back afterwards, and the next assignment's
seek overwrites it only for a partition the broker has a commit of: a partition never committed then showed
that offset as committed (``opsloop_stream_committed_offset``) and Faust ignored every ack below it, so the
records read again from the log start were handled and never committed. :class:`WorkerConsumer` forgets such
offsets (unknown: the broker is asked at the next seek or progress look), logs ``commit_refused`` and counts
``opsloop_stream_commits_refused_total``. Not retried: the partitions' owner in the next generation reads the
records again from the group's last commit (at-least-once; ``tests/streams/test_commit_refused.py``).
"""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from typing import Any, Callable, Mapping

import aiokafka
import faust
from aiokafka.consumer.fetcher import OffsetResetStrategy
from faust.transport.drivers import aiokafka as driver
from faust.types import TP

from opsloop.log import get_logger
from opsloop.streams.runtime.delivery import DrainConsumer
from opsloop.streams.runtime.health import COMMITS_REFUSED

log = get_logger("stream.transport")


def faust_leader_topic(app_id: str) -> str:
    """The name of Faust's leader-election topic (``faust/assignor/leader_assignor.py``, ``_leader_topic_name``)."""
    return f"{app_id}-__assignor-__leader"


async def seek_to_committed(consumer: aiokafka.AIOKafkaConsumer,
                            is_internal: Callable[[TP], bool]) -> dict[TP, int | None]:
    """Seek every assigned partition to its committed offset, and a stream partition with none (or 0) to
    where the consumer starts one without a commit; returns the committed offsets, as aiokafka's.
    ``is_internal``: a partition of Faust's own (a table's changelog, the leader topic), never reset."""
    committed: dict[TP, int | None] = await consumer.seek_to_committed()
    subscription = consumer._subscription.subscription
    assignment = subscription.assignment if subscription is not None else None
    if assignment is None or not assignment.active:
        return committed   # revoked meanwhile: the next assignment starts from the commits anyway
    fresh = [tp for tp, offset in committed.items()
             if not (offset and offset > 0) and not is_internal(tp) and tp in assignment.tps]
    if not fresh:
        return committed
    fetcher = consumer._fetcher
    strategy = fetcher._default_reset_strategy
    if strategy == OffsetResetStrategy.NONE:
        return committed   # no reset position to go to: aiokafka raises on these itself
    log.info("uncommitted_partitions_reset", partitions=len(fresh),
             topics=dict(sorted(Tally(tp.topic for tp in fresh).items())),
             to=OffsetResetStrategy.to_str(strategy),
             reason="no committed offset to seek back to: from where a new assignment starts")
    # The partitions' positions are dropped at once (nothing is fetched from the old one); the wait is
    # for the new positions, bounded as aiokafka's seek_to_beginning bounds it.
    reset = fetcher.request_offset_reset(fresh, strategy)
    await asyncio.wait([reset, assignment.unassign_future], timeout=consumer._request_timeout_ms / 1000,
                       return_when=asyncio.FIRST_COMPLETED)
    return committed


def kafka_transport(app: faust.App, fetch_max_wait_ms: int) -> driver.Transport:
    """The app's consumer transport (set it as ``app.transport`` before the app starts)."""

    class ConsumerThread(driver.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # aiokafka hands this to its Fetcher in start(); there is no public setter.
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

        async def seek_to_committed(self) -> Mapping[TP, int]:
            return await self.call_thread(self._seek_to_committed)

        async def _seek_to_committed(self) -> Mapping[TP, int]:
            is_changelog, leader = self.consumer._is_changelog_tp, faust_leader_topic(app.conf.id)
            return await seek_to_committed(self._ensure_consumer(),
                                           lambda tp: tp.topic == leader or is_changelog(tp))

    class WorkerConsumer(DrainConsumer):   # and a record delivered without four tasks (delivery.py)
        def _new_consumer_thread(self) -> ConsumerThread:
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

        async def _commit_offsets(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
            did_commit: bool = await super()._commit_offsets(offsets, start_new_transaction=start_new_transaction)
            if not did_commit:
                forget_refused_commit(self._committed_offset, offsets)
            return did_commit

    class Transport(driver.Transport):
        Consumer = WorkerConsumer

    return Transport(app.conf.broker_consumer, app)


def forget_refused_commit(committed: dict[TP, int | None], offsets: Mapping[TP, int]) -> dict[TP, int]:
    """Drop from Faust's ``committed`` the ``offsets`` of a commit that did not happen, which Faust recorded as
    committed anyway (module docstring); log and count it. Returns what was dropped. Faust records only offsets
    above the one it knew (``_should_commit``): one equal to its record now was written by this commit."""
    refused = {tp: offset for tp, offset in offsets.items() if committed.get(tp) == offset}
    if not refused:
        return refused   # nothing was sent: every partition had been revoked (Faust logs that itself)
    for tp in refused:
        committed.pop(tp, None)   # unknown: the next seek (or the progress look) asks the broker
    COMMITS_REFUSED.inc()
    log.warning("commit_refused", partitions=len(refused),
                offsets=[{"topic": tp.topic, "partition": tp.partition, "offset": offset}
                         for tp, offset in sorted(refused.items())[:20]],
                reason="the group refused it (this member's generation ended: a rebalance or a pause past the "
                       "session timeout); the partitions' owner reads these records again from the last commit")
    return refused
