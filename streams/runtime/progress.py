"""Partition progress: what every held source partition has committed, batch or not (Burrow-style).

The batch metrics (``opsloop_stream_consumer_lag``, ``..._last_batch_timestamp_seconds``) are set only when a
batch is processed. A worker that holds partitions and processes nothing (seen: a restarted worker positioned
past its records, assigned, not paused, no batch ever) exported nothing about them, and no alert could fire.

Every ``stream.progress_interval_s`` this task sets, for each partition of the agents' source topics this
worker holds (not changelogs, not Faust's leader topic, not the topics the agents only write to):

- ``opsloop_stream_committed_offset{group,topic,partition}``: the group's committed offset: Faust's own record of
  what it committed or found committed at the assignment's seek; for a partition it knows none of (before
  that seek, or never committed), one batched OffsetFetch per tick, and for one with no commit at all its
  log-start offset (nothing of it was handled);
- ``opsloop_stream_uncommitted_records{group,topic,partition}``: highwater − committed (≥ 0); a partition whose
  highwater is unknown (no fetch yet) is skipped.

Both, and the partition's ``opsloop_stream_consumer_lag``, are removed for a partition this worker no longer
holds: at its revocation and at every tick, so a former owner does not go on exporting its last values.
``OpsloopStreamPartitionStuck`` fires on a partition with uncommitted records whose committed offset has not
moved for 10 min, whichever worker held it, per consumer group (``group``: the app id; two groups reading one
topic, e.g. two deployments' workers, are told apart: one group's progress hid the other's stuck partition).
A failing look is logged (``stream_progress_failed``, once a minute) and the next tick comes as usual.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence

import faust
from faust.exceptions import ConsumerNotStarted
from faust.types import TP

from opsloop.log import Sampled, get_logger
from opsloop.streams.runtime import health
from opsloop.streams.runtime.periodic import PeriodicService

log = get_logger("stream.progress")
FAILED_LOG = Sampled(60.0)

# committed offsets of the given partitions as the broker has them, the log-start offset where none
BrokerOffsets = Callable[[Sequence[TP]], Awaitable[Mapping[TP, int]]]
# The broker is asked on the consumer's thread, whose two method-queue workers also run Faust's commits and
# seeks: after a failed look the broker is left alone 1, 2, 4 ... up to this many ticks (a broker away must not
# have this task hold one of them every tick).
MAX_BROKER_SKIP_TICKS = 16


def source_topics(app: Any) -> set[str]:
    """The topics the app's agents consume (prefix applied): the stream sources, nothing of Faust's own."""
    return {str(t) for agent in list(app.agents.values()) for t in getattr(agent.channel, "topics", ())}


class PartitionProgress:
    """See the module docstring. ``tick`` is one look; ``broker_offsets`` is injectable for tests."""

    def __init__(self, app: Any, timeout_s: float = 5.0, broker_offsets: BrokerOffsets | None = None) -> None:
        self.app, self.timeout_s = app, timeout_s
        self.group = str(app.conf.id)   # the consumer group: the gauges' group label
        self.broker_offsets: BrokerOffsets = broker_offsets or self._broker_offsets
        self.exported: set[TP] = set()
        # the assignment Faust's rebalance signals told (None: not told yet): aiokafka's own still lists
        # the revoked partitions until the group is joined again
        self.held: set[TP] | None = None
        self.broker_failures = 0   # failed broker looks in a row
        self.broker_skip = 0       # ticks left before the broker is asked again

    def on_revoked(self, revoked: Iterable[TP]) -> None:
        revoked = set(revoked)
        if self.held is not None:
            self.held -= revoked
        self.forget(revoked)

    def on_assigned(self, assigned: Iterable[TP]) -> None:
        self.held = set(assigned)   # the whole new assignment

    def forget(self, tps: Iterable[TP]) -> None:
        for tp in tps:
            labels = (tp.topic, str(tp.partition))
            for gauge, values in ((health.COMMITTED_OFFSET, (self.group, *labels)),
                                  (health.UNCOMMITTED, (self.group, *labels)), (health.LAG, labels)):
                try:
                    gauge.remove(*values)
                except KeyError:
                    pass   # never set on this worker
            self.exported.discard(tp)

    def assigned(self, sources: set[str]) -> set[TP]:
        """The source partitions this worker holds now (none before its consumer started)."""
        try:
            tps = {tp for tp in self.app.consumer.assignment() if tp.topic in sources}
        except ConsumerNotStarted:
            return set()
        return tps if self.held is None else tps & self.held

    async def tick(self) -> None:
        sources = source_topics(self.app)
        assigned = self.assigned(sources)
        self.forget(self.exported - assigned)
        self._forget_lag(sources, assigned)
        if not assigned:
            return
        known: dict[TP, int | None] = self.app.consumer._committed_offset   # Faust's own (a defaultdict)
        # None: not known; 0: stored as None too. A partition never written (highwater 0) has nothing to ask
        # about: committed 0, nothing waiting (the quiet partitions of a quiet topic are asked about never)
        highwaters = {tp: self._highwater(tp) for tp in assigned}
        unknown = sorted(tp for tp in assigned if not known.get(tp) and highwaters[tp])
        on_broker: Mapping[TP, int] = {}
        if unknown and self.broker_skip > 0:
            self.broker_skip -= 1
        elif unknown:
            try:   # the partitions Faust knows a commit of are exported even when the broker does not answer
                on_broker = await asyncio.wait_for(self.broker_offsets(unknown), 3 * self.timeout_s)
                self.broker_failures = 0
            except Exception as e:  # noqa: BLE001 - logged; those partitions wait for a later tick
                self.broker_failures += 1
                self.broker_skip = min(2 ** (self.broker_failures - 1), MAX_BROKER_SKIP_TICKS)
                FAILED_LOG.warning(log, "stream_progress_failed", key="broker", partitions=len(unknown),
                                   error=f"{type(e).__name__}: {e}", next_look_in_ticks=self.broker_skip + 1)
        now_assigned = self.assigned(sources)   # a rebalance may have come during the fetch
        self.forget(self.exported - now_assigned)
        for tp in sorted(assigned & now_assigned):
            highwater = highwaters[tp]
            committed = known.get(tp) or on_broker.get(tp)
            if committed is None and highwater == 0:
                committed = 0
            if committed is None or highwater is None:
                continue
            labels = (self.group, tp.topic, str(tp.partition))
            health.COMMITTED_OFFSET.labels(*labels).set(committed)
            health.UNCOMMITTED.labels(*labels).set(max(0, highwater - committed))
            self.exported.add(tp)

    async def safe_tick(self) -> None:
        try:
            await self.tick()
        except Exception as e:  # noqa: BLE001 - one bad look must not end the task
            FAILED_LOG.warning(log, "stream_progress_failed", key="tick", error=f"{type(e).__name__}: {e}")

    def _highwater(self, tp: TP) -> int | None:
        try:
            return self.app.consumer.highwater(tp)
        except Exception:  # noqa: BLE001 - revoked meanwhile / no fetch yet
            return None

    def _forget_lag(self, sources: set[str], assigned: set[TP]) -> None:
        """The batch lag of source partitions no longer held (process_batch sets it, nothing removed it)."""
        for family in health.LAG.collect():
            for s in family.samples:
                topic, partition = s.labels.get("topic", ""), s.labels.get("partition", "")
                if topic in sources and partition.isdigit() and TP(topic, int(partition)) not in assigned:
                    self.forget([TP(topic, int(partition))])

    async def _broker_offsets(self, tps: Sequence[TP]) -> Mapping[TP, int]:
        """One OffsetFetch for ``tps`` and, for those never committed, one ListOffsets (log start), on the
        consumer's thread (its aiokafka client lives there), each bounded by ``timeout_s``."""
        thread = self.app.consumer._thread
        consumer = thread._ensure_consumer()
        timeout = self.timeout_s

        async def fetch() -> Mapping[TP, int]:
            found = await asyncio.wait_for(consumer._coordinator.fetch_committed_offsets(list(tps)), timeout)
            out: dict[TP, int] = {TP(tp.topic, tp.partition): meta.offset for tp, meta in found.items()
                                  if meta.offset >= 0}
            missing = [tp for tp in tps if tp not in out]
            if missing:
                starts = await asyncio.wait_for(consumer.beginning_offsets(missing), timeout)
                out.update({TP(tp.topic, tp.partition): offset for tp, offset in starts.items()})
            return out

        return await thread.call_thread(fetch)


class _ProgressService(PeriodicService):
    """Runs the ticks from the app's start, as the recovery watchdog (a stuck first recovery is also a
    worker that holds partitions and processes nothing)."""

    def __init__(self, progress: PartitionProgress, interval_s: float, **kwargs: Any) -> None:
        self.progress = progress
        super().__init__(interval_s, **kwargs)

    async def once(self) -> None:
        await self.progress.safe_tick()


def install_partition_progress(app: faust.App, interval_s: float) -> PartitionProgress:
    """Start a :class:`PartitionProgress` with the app (every worker; call before the app starts)."""
    progress = PartitionProgress(app, timeout_s=min(5.0, max(1.0, interval_s)))

    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        progress.on_revoked(revoked)

    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        progress.on_assigned(assigned)

    app.on_partitions_revoked.connect(on_revoked, weak=False)
    app.on_partitions_assigned.connect(on_assigned, weak=False)
    app.add_dependency(_ProgressService(progress, interval_s))
    return progress
