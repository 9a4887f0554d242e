"""The agent loop of a detector: batches in, findings out, state in a changelog-backed Faust table.

The runtime's ``batch_agent`` calls a sync handler and stops there; a detector also has to write
its state and send its findings, both async. This loop follows the same pattern (``take_batches``,
``opsloop.streams.runtime.batch.process_batch`` for decoding, dead letters and health metrics) and adds:

0. **One agent for all detectors** (``detectors``), over the union of their topics: a record is
   fetched, decoded and dead-lettered once, and every handler sees the batch.
1. **State table** ``detector-state`` (keys ``<handler>|<state key>``,
   JSON values, memory store rebuilt from its compacted changelog topic on start). After each
   batch the keys the handler touched are written **once** each, into the changelog partition
   of the key's own records (its *home*: the partition number of the records that fed it, see
   ``DetectorHandler.fed``, or until they come the partition Faust recovered it from), so the
   state of a series lives in the same partition number as the series and moves with it on a
   rebalance (Faust assigns table partitions together with source partitions). Faust writes a table key to
   the partition of the *current event*, so the key
   is written under the latest event of its home partition. Not the partition of the batch
   that touched it: a handler changes keys of other partitions too (the firewall's drift check
   updates findings about every hypervisor of the role, the power handler a whole generation),
   and such a key written there lived in two changelog partitions: on restart the copy recovered
   last won, possibly the older one (a finding re-opened, re-paged), and with several workers
   the owner of the key missed the newer state (``tests/streams/agents/test_state_partition.py``).
   A key whose records come from a new partition (netperf: a target set measured from another
   host, ipmi readings keyed by generation, partitions added) moves there and is deleted from the old one
   (``_delete_copy``: a tombstone sent straight to that partition, no event of it needed; before, one that got
   no more records never had one and kept the old copy for good), so it keeps one copy. Of several copies of a
   key the recovery keeps the one written last, whatever the partitions' order (:class:`StateTable`, by the
   records' Kafka time; before, the copy recovered last won: the state from before a move, or the old copy's
   tombstone deleting the new one), and the restore deletes the older copies it found (deployments from before
   this fix hold such pairs; ``state_old_copies_deleted``; ``tests/streams/agents/test_state_newest_copy.py``,
   ``test_state_moved_live.py``).
   A source partition with no changelog partition of its number (partitions added to a telemetry
   topic, not to the changelog): its keys' state is not written (``state_not_written``, counted in
   ``opsloop_stream_errors_total``), kept in memory. Before, the write went to the producer, which
   asserted on the unknown partition: its buffer crashed, the worker stopped, and every restart
   replayed the batch and crashed again (``tests/streams/test_partitions_added.py``).
   A state whose record the producer would refuse (over Faust's ``producer_max_request_size``, weighed as
   aiokafka weighs it: the bytes of the table's codecs plus record overhead, :meth:`StatefulAgent.record_size`)
   is not written either (``state_too_large``, ``opsloop_stream_state_dropped_total{reason="too_large"}``),
   kept in memory, its older copy left where it lives (a moved key's too; deleted by the move's first write
   that fits, or, a not-written key's, by a restore once the new copy is written: the older never wins).
   Before, aiokafka raised
   ``MessageSizeTooLargeError`` in Faust's producer buffer task: the worker crashed, every detector with it
   (``tests/streams/agents/test_state_too_large_live.py``).
2. **Restore**: at the first batch after start or after a partition assignment, the handler's
   state is replaced by the table's (already recovered by Faust: consumption of an assigned
   partition resumes only after its table partitions are recovered). A value a handler cannot use
   is refused, that key alone (``DetectorHandler.restore``: logged, counted ``reason="unreadable"``);
   bytes that are no JSON reach it as :class:`UnreadableState` (the table's codec, :class:`StateCodec`),
   not as an error inside Faust's recovery; a refused key's readable open findings are cleared, published
   with the next batch's findings. A changelog key that is no JSON string reads as :class:`UnreadableKey`
   (:class:`StateKeyCodec`): logged ``state_key_unreadable`` with topic, partition and offset, counted
   ``reason="unreadable"`` under handler ``unknown``, dropped from memory. A killed worker therefore
   resumes without a second warm-up and without re-opening open findings. After a rebalance only
   the keys of the worker's partitions stay in memory and are restored (``assign``): not the keys
   of a partition that left, nor the standby copies Faust applies to the same store.
3. **Findings** drained from the handlers are sent, and their delivery awaited (one bounded wait per
   batch, ``stream.findings_delivery_timeout_s``), before the state is written, both before the
   offsets of the batch can be committed by the next commit interval (at-least-once: a crash in
   between replays the batch; a finding's ``first_seen`` is event time, so a replay yields the
   same finding). What the broker did not acknowledge in time waits in the sink's outbox and is
   sent again, in order per finding, at the next batch and by the sink's retry service
   (:mod:`opsloop.streams.agents.findings_sink`); saved in ``stream.data_dir`` meanwhile, so a worker that
   stops or crashes sends them first when it starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from pathlib import Path
from typing import Any, Iterator, Mapping, MutableMapping, Sequence

import faust
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from faust.serializers import codecs
from faust.streams import _current_event
from faust.types import TP, EventT
from faust.types.tuples import FutureMessage
from prometheus_client import Gauge

from opsloop.config import Settings
from opsloop.log import Sampled, get_logger
from opsloop.records import Finding
from opsloop.topics import Topic
from opsloop.streams.agents.base import DetectorHandler, Publication
from opsloop.streams.agents.findings_sink import OUTBOX_FILE, FindingsRetry, FindingsSink
from opsloop.streams.bounded import STATE_DROPPED, UNREADABLE
from opsloop.streams.detectors.findingbook import CLEARED
from opsloop.streams.runtime import health
from opsloop.streams.runtime.app import deadletter_sender, partition_highwater, raw_topic
from opsloop.streams.runtime.batch import DeadLetter, FanOut, gc_paused, process_batch, send_deadletters
from opsloop.streams.runtime.take import consumer_lag, leave_unacked, take_batches

log = get_logger("stream.agents")

STATE_TABLE = "detector-state"
AGENT_NAME = "detectors"
KEY_SEP = "|"
# state not written for want of a changelog partition: every batch of those keys, one line a minute
NOT_WRITTEN_LOG = Sampled(60.0)
METADATA_REFRESH_S = 5.0   # at most one producer metadata refresh asked for per interval (a grown changelog)
# a state whose changelog record the producer would refuse: not sent, kept in memory (STATE_DROPPED's reason)
TOO_LARGE = "too_large"
TOO_LARGE_LOG = Sampled(60.0)   # one line a minute per handler: a big key is refused at every batch touching it
# A batch's state writes are acknowledged by the broker before its offsets may be committed (run_batch). The batch
# waits for them as long as the producer holds them (aiokafka keeps a write through a broker outage and fails it
# only when it gives up on it): past STATE_CONFIRM_S it says so (log state_writes_waiting once, STATE_WAITING).
# Those refused are written again, at most STATE_WRITE_ATTEMPTS times in all, STATE_RETRY_PAUSE_S apart; what is
# still refused then is dead-lettered, and the batch goes on.
STATE_CONFIRM_S = 60.0
STATE_WRITE_ATTEMPTS = 3
STATE_RETRY_PAUSE_S = 0.5
STATE_LOOK_S = 1.0   # while waiting, the producer and the app are looked at this often (a stop ends the wait)
WRITE_FAILED_LOG = Sampled(60.0)   # one line a minute per handler: a refused key fails at every batch touching it
STATE_WAITING = Gauge("opsloop_stream_state_writes_waiting",
                      "State (changelog) writes of the batch in hand the broker has not acknowledged after "
                      f"{STATE_CONFIRM_S:.0f} s: the batch and its offsets wait for them (0: none)", ["agent"])


class UnreadableState:
    """A ``detector-state`` value whose bytes are no JSON (torn, or damaged on the way): what
    :class:`StateCodec` gives instead of raising. Its handler refuses it at the restore like any state it
    cannot use (logged naming the key, counted ``reason="unreadable"``), and the key starts afresh."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"unreadable value ({self.error})"


class StateCodec(codecs.Codec):
    """Faust's ``json`` codec, except that a value it cannot read decodes to :class:`UnreadableState`.

    With the ``json`` codec such a changelog record raised inside Faust's recovery: skipped without a word
    of which key (the key kept an older value, or none), and, the last record of its partition, the
    recovery waited for it until the watchdog gave up on it as a gap (``streams/runtime/watchdog.py``)."""

    _JSON = codecs.get_codec("json")

    def _dumps(self, obj: Any) -> bytes:
        return self._JSON.dumps(obj)

    def _loads(self, s: bytes) -> Any:
        try:
            return self._JSON.loads(s)
        except Exception as e:  # noqa: BLE001 - whatever the bytes, the key is refused, not the recovery
            return UnreadableState(f"{type(e).__name__}: {e}"[:200])


STATE_CODEC = StateCodec()


class UnreadableKey:
    """A ``detector-state`` changelog key that is no key this table writes (a JSON string): torn bytes, bytes
    that are no UTF-8, other JSON. What :class:`StateKeyCodec` gives instead of raising, hashable, so Faust's
    recovery applies its record like any other; the recovery's callback (:func:`_on_changelog_event`) logs it
    naming topic, partition and offset and counts it, and the restore drops it from memory (no handler's)."""

    __slots__ = ("error", "raw")

    def __init__(self, error: str, raw: bytes) -> None:
        self.error, self.raw = error, raw

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnreadableKey) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash((UnreadableKey, self.raw))

    def __repr__(self) -> str:
        return f"unreadable key {self.raw[:80]!r} ({self.error})"


class StateKeyCodec(StateCodec):
    """:class:`StateCodec` for the table's keys: a key that is no JSON string decodes to :class:`UnreadableKey`.
    With ``json`` such a key raised ``KeyDecodeError`` inside Faust's recovery: logged by Faust as ``Error in
    recovery`` without topic or offset, counted nowhere, and, the last record of its partition, it held the
    recovery until the watchdog found the partition read past its end (a gap); a JSON object raised later, at
    every flush of the recovery's buffer, never applied."""

    def _loads(self, s: bytes) -> Any:
        key = super()._loads(s)
        if isinstance(key, UnreadableState):
            return UnreadableKey(key.error, bytes(s[:200]))
        if not isinstance(key, str):
            return UnreadableKey(f"a JSON {type(key).__name__}, not a string", bytes(s[:200]))
        return key


STATE_KEY_CODEC = StateKeyCodec()
UNKNOWN_HANDLER = "unknown"   # the handler label of a refused record whose key names none


async def _on_changelog_event(event: EventT) -> None:
    """Every changelog record Faust's recovery applies (active and standby): one whose key is unreadable is
    logged, with where it lies, and counted under handler ``unknown`` (its key names none)."""
    if isinstance(event.key, UnreadableKey):
        msg = event.message
        log.error("state_key_unreadable", topic=msg.topic, partition=msg.partition, offset=msg.offset,
                  key=repr(event.key.raw[:80]), error=event.key.error)
        STATE_DROPPED.labels(UNKNOWN_HANDLER, UNREADABLE).inc()


def _now_ms() -> int:
    return int(time.time() * 1000)


class StateTable(faust.Table):
    """The ``detector-state`` table: Faust's, except that of several changelog partitions holding a key, the copy
    written last wins, whatever order they are recovered (or applied as standby) in.

    A key whose records moved partition had a copy in each; Faust applies every changelog partition to one dict,
    so the partition recovered last won: possibly the copy from before the move (an old baseline, cleared findings
    open again, open ones lost), or the tombstone of the old copy deleting the new one. Each record applied is
    stamped with its Kafka timestamp (ms) and partition; a record of another partition than the key's stamp that is
    older (a value beats a tombstone of the same ms) is not applied, but kept as a *stale copy* for the agent to
    delete (:meth:`stale_copies`). Records of one partition apply in offset order, as before. This worker's own
    writes are stamped too, so its own tombstone of an old copy, applied back as a standby record, does not delete
    the key it has just written elsewhere. Stamps are kept for the keys in memory (and a recovery's tombstones,
    until it completes)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stamps: dict[Any, tuple[int | None, int, bool]] = {}   # key -> (ms, partition, live) of the copy held
        self._stale: dict[Any, set[int]] = {}   # key -> partitions whose latest record is an older live copy
        self._sent: list[FutureMessage] = []   # changelog writes since take_sent(): the agent awaits their delivery

    def send_changelog(self, *args: Any, **kwargs: Any) -> FutureMessage:
        fut = super().send_changelog(*args, **kwargs)
        self._sent.append(fut)
        return fut

    def take_sent(self) -> list[FutureMessage]:
        """The changelog writes (values, deletes, tombstones) sent since the last call: their delivery futures."""
        out, self._sent = self._sent, []
        return out

    def apply_changelog_batch(self, batch: Any) -> None:
        super().apply_changelog_batch([e for e in batch if self._newest(e)])

    def _newest(self, event: EventT) -> bool:
        """Whether ``event`` (a changelog record) is the key's newest copy so far; notes the stale ones."""
        key, msg = self._to_key(event.key), event.message
        p, live = msg.partition, msg.value is not None
        # no order to trust without the writer's time (LogAppendTime: the broker's, not the stamp a delete sets)
        stamp = getattr(msg, "timestamp", None)
        ts = None if stamp is None or getattr(msg, "timestamp_type", 0) == 1 else round(stamp * 1000)
        prev = self._stamps.get(key)
        older = prev is not None and prev[1] != p and ts is not None and prev[0] is not None \
            and (ts, live) < (prev[0], prev[2])
        stale = self._stale.get(key, set())
        if older:
            (stale.add if live else stale.discard)(p)   # an older copy (or its delete): not applied
        else:
            if prev is not None and prev[1] != p and prev[2]:
                stale.add(prev[1])   # the copy held so far is older: its partition keeps a stale one
            stale.discard(p)
            self._stamps[key] = (ts, p, live)
        if stale:
            self._stale[key] = stale
        else:
            self._stale.pop(key, None)
        return not older

    def on_key_set(self, key: Any, value: Any) -> None:
        super().on_key_set(key, value)
        self._stamps[key] = (_now_ms(), self.partition_for_key(key) or 0, True)

    def on_key_del(self, key: Any) -> None:
        super().on_key_del(key)
        self._stamps.pop(key, None)   # bounded: no stamp kept for a key this worker forgot

    def tombstone(self, key: Any, partition: int, stamp_ms: int | None = None) -> None:
        """Delete ``key``'s copy in changelog ``partition``, with no event of that partition (memory untouched).

        Stamped ``stamp_ms``: by default now, before the write of the key's new copy that follows, so that copy
        wins at a recovery; an older copy found by a recovery is deleted at its newest copy's time (a value wins
        a tie), or the delete, newer, would win over the copy kept."""
        ms = _now_ms() if stamp_ms is None else stamp_ms
        self._sent.append(self.changelog_topic.send_soon(
            key=key, value=None, partition=partition, timestamp=ms / 1000.0, key_serializer=self.key_serializer,
            value_serializer="raw", callback=self._on_changelog_sent))

    def stale_copies(self) -> dict[Any, tuple[int, int, set[int]]]:
        """Key -> (partition and time in ms of its newest copy, partitions holding an older live copy), handed over
        and forgotten: the keys a recovery found in several partitions (before this fix a moved key whose old
        partition got no more records kept its old copy). Not those without record times (no order to trust)."""
        out = {k: (stamp[1], stamp[0], parts) for k, parts in self._stale.items()
               if (stamp := self._stamps.get(k)) is not None and stamp[0] is not None}
        self._stale.clear()
        return out

    async def on_recovery_completed(self, active_tps: set[TP], standby_tps: set[TP]) -> None:
        await super().on_recovery_completed(active_tps, standby_tps)
        # bounded: stamps of the keys held (and of those whose stale copies the agent is still to delete)
        self._stamps = {k: s for k, s in self._stamps.items() if k in self.data or k in self._stale}


def state_table(app: faust.App) -> StateTable:
    """The one state table of all detector agents (create once per app)."""
    existing = app.tables.get(STATE_TABLE)
    if existing is not None:
        return existing  # type: ignore[return-value]
    table = app.tables.add(StateTable(
        app, name=STATE_TABLE, default=None, beacon=app.tables.beacon,
        schema=faust.Schema(key_serializer="json", value_serializer="json"),
        help="Detector state per agent and state key (JSON), for restarts and rebalances",
        on_changelog_event=_on_changelog_event))
    # Faust's table and its changelog topic take their serializers from the key and value types (json for
    # none) over the schema's: set after (writes go through the table's, reads through the topic's schema,
    # which each clone of the topic, the recovery's among them, sets from the topic's)
    topic = table.changelog_topic
    table.value_serializer = topic.value_serializer = topic.schema.value_serializer = STATE_CODEC
    table.key_serializer = topic.key_serializer = topic.schema.key_serializer = STATE_KEY_CODEC
    return table  # type: ignore[return-value]


def findings_sink(app: faust.App) -> FindingsSink:
    topic = raw_topic(app, Topic.FINDINGS)

    async def send(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> object:
        return await topic.send(key=key, value=value, headers=headers)

    # the outbox survives a stop or a crash in the worker's data dir (stream.data_dir: create_app's datadir)
    return FindingsSink(send, outbox_path=Path(app.conf.datadir) / OUTBOX_FILE)


@contextlib.contextmanager
def _as_current(event: EventT) -> Iterator[None]:
    """Make ``event`` Faust's current event, so a table write goes to its partition."""
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


class StatefulAgent:
    """Runs ``DetectorHandler``s as one Faust agent over the union of their topics (module docstring).

    One agent, not one per handler: a record is fetched, decoded and (if bad) dead-lettered once,
    however many detectors read its topic (the anomaly detector shares topics with the others).
    """

    def __init__(self, app: faust.App, handlers: Sequence[DetectorHandler], settings: Settings, table: faust.Table,
                 sink: FindingsSink, name: str = AGENT_NAME) -> None:
        self.app = app
        self.handlers = list(handlers)
        self.name = name
        self.table = table
        self.sink = sink
        sink.bound_delivery(delivery_timeout_s=settings.stream.findings_delivery_timeout_s,
                            max_outbox=settings.stream.findings_outbox_max)
        self.retry_interval_s = settings.stream.findings_retry_interval_s
        self.size = settings.stream.batch_size
        self.within = settings.stream.batch_within_s
        self.backlog_within = settings.stream.batch_backlog_within_s
        self.max_clock_skew_s = settings.stream.max_clock_skew_s
        self.needs_restore = True
        self._refusal_clears: list[Publication] = []   # the restore's clears of refused keys, for the next publish
        self._send_deadletter, self._highwater = deadletter_sender(app), partition_highwater(app)
        self._all = FanOut(name, self.handlers)
        # handler -> state key -> home partition (where the key's records come from); an entry goes
        # with its key's table entry (deleted: forgotten by TTL or cap) or with its partition (revoked)
        self._home: dict[str, dict[str, int]] = {h.name: {} for h in self.handlers}
        # partition -> its latest event, a table write's current event for the keys living there:
        # a strong ref per assigned partition (events are otherwise dropped after their batch)
        self._last: dict[int, EventT] = {}
        self._held: dict[int, EventT] = {}   # revoked partitions' latest events, until the assignment says
        # source partitions Faust assigned this worker (None: not told yet, every table key is ours)
        self._assigned: set[int] | None = None
        self._source_topics: set[str] = set()
        self.home_unknown = 0   # writes of a key whose home was not known (module docstring)
        self.home_moved = 0     # keys whose records came from another partition than their state's
        self.not_written = 0    # state writes skipped: their partition has no changelog partition
        self.too_large = 0      # state writes skipped: the record over the producer's max request size
        # aiokafka refuses a record whose estimate (key + value + record and batch overhead) is above this, in
        # Faust's producer buffer task: the worker crashed (write_state)
        self.max_record_bytes: int = app.conf.producer_max_request_size
        self._refreshed_at = float("-inf")   # monotonic time of the last producer metadata refresh asked for
        # this batch's state writes: (handler, key) -> (the event written under, their delivery futures)
        self._writes: dict[tuple[DetectorHandler, str], tuple[EventT, list[FutureMessage]]] = {}
        self.write_failures = 0   # state writes the broker refused (or aiokafka gave up on)

    @property
    def topics(self) -> list[str]:
        return sorted({str(t) for h in self.handlers for t in h.topics})

    def register(self) -> None:
        # raw_topic: kafka.topic_prefix applied like every other topic of the deployment, and
        # internal=True (Faust creates the source topics at subscription with the app's partition
        # count, the same as the state table's, instead of waiting minutes for a metadata refresh).
        source = raw_topic(self.app, *self.topics)
        self._source_topics = set(source.topics)
        health.deadletter_series(self._source_topics)

        async def agent(stream: faust.StreamT) -> None:
            async for events in take_batches(stream, self.size, self.within, self.backlog_within,
                                             consumer_lag(self.app)):
                try:
                    await self.run_batch(events)
                except Exception as e:  # noqa: BLE001 - a bug here must not stop the agent for good
                    health.ERRORS.labels(self.name).inc()
                    log.error("detector_batch_failed", agent=self.name, error=f"{type(e).__name__}: {e}",
                              exc_info=True)

        async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
            # the whole new assignment (Faust sends it all after each rebalance)
            self.assign({tp.partition for tp in assigned if tp.topic in self._source_topics})
            self._check_partition_counts()

        async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
            self.revoke({tp.partition for tp in revoked if tp.topic in self._source_topics})

        self.app.on_partitions_assigned.connect(on_assigned, weak=False)
        self.app.on_partitions_revoked.connect(on_revoked, weak=False)
        self.app.agent(source, name=self.name)(agent)
        # the findings outbox sent again when no batch comes; its leftovers logged at stop
        self.app.add_dependency(FindingsRetry(self.sink, self.retry_interval_s))

    def revoke(self, partitions: set[int]) -> None:
        """Stop writing under ``partitions``' events (maybe no longer ours); the assignment that
        follows says which stay (Kafka's eager rebalance revokes every partition first)."""
        for p in partitions:
            event = self._last.pop(p, None)
            if event is not None:
                self._held[p] = event
        self.needs_restore = True

    def assign(self, partitions: set[int]) -> None:
        """Keep in memory only the state of ``partitions`` (this worker's after a rebalance).

        Faust's memory store drops after a recovery only the keys the recovery filled; a key first
        written here lived on after its partition went to another worker: restored into our handlers
        (acting on a stale copy, writing it back under another partition) and, if the partition came
        back with the key's tombstone compacted away, alive here though deleted there. Dropped from
        memory only: the changelog is the new owner's."""
        self._assigned = set(partitions)
        for p in [p for p in self._last if p not in partitions]:
            del self._last[p]
        # A partition kept through the rebalance keeps its latest event: without it, every key of that
        # partition changed by another's records before its own first batch was written to the wrong
        # partition (a stray copy a restart could recover last), at each rebalance.
        for p, event in self._held.items():
            if p in partitions:
                self._last.setdefault(p, event)
        self._held.clear()
        for table_key in list(self.table):
            p = self._partition_of(table_key)
            if p is not None and p not in partitions:
                self._drop_local(table_key)
        for home in self._home.values():   # homes of keys not in the table (none expected): bounded too
            for key in [k for k, p in home.items() if p not in partitions]:
                del home[key]
        self.needs_restore = True

    def _partition_of(self, table_key: Any) -> int | None:
        """The changelog partition ``table_key`` belongs to: its home, else where Faust recovered it from."""
        if isinstance(table_key, str) and KEY_SEP in table_key:
            handler, key = table_key.split(KEY_SEP, 1)
            p = self._home.get(handler, {}).get(key)
            if p is not None:
                return p
        return self.recovered_partitions().get(table_key)

    def _drop_local(self, table_key: Any) -> None:
        """Forget ``table_key`` here without a tombstone (its partition is another worker's)."""
        if isinstance(table_key, str) and KEY_SEP in table_key:
            handler, key = table_key.split(KEY_SEP, 1)
            self._home.get(handler, {}).pop(key, None)
        raw = getattr(getattr(self.table, "data", None), "data", None)   # the memory store's dict: no changelog write
        if isinstance(raw, MutableMapping):
            raw.pop(table_key, None)
        recovered = self._store_partitions()
        if recovered is not None:
            recovered.pop(table_key, None)

    def recovered_partitions(self) -> Mapping[Any, int]:
        """Table key -> the changelog partition Faust recovered it from (its home, written there).

        Faust's memory store keeps this map (``_key_partition``, filled by the recovery, kept in step
        with our writes by ``write_state``) to drop the keys of partitions not assigned after a
        rebalance; empty for a store without it."""
        found = self._store_partitions()
        return {} if found is None else found

    def _store_partitions(self) -> MutableMapping[Any, int] | None:
        found = getattr(getattr(self.table, "data", None), "_key_partition", None)
        return found if isinstance(found, MutableMapping) else None

    def restore(self) -> None:
        by_handler: dict[str, dict[str, Any]] = {h.name: {} for h in self.handlers}
        for k, v in list(self.table.items()):
            if isinstance(k, UnreadableKey):
                self._drop_local(k)   # no handler's (logged and counted as the recovery applied it)
                continue
            if not isinstance(k, str) or v is None or KEY_SEP not in k:
                continue   # (a value not an object goes to its handler, which refuses it: logged, counted)
            handler, key = k.split(KEY_SEP, 1)
            p = self._partition_of(k)
            if self._assigned is not None and p is not None and p not in self._assigned:
                continue   # a standby copy of another worker's partition (Faust fills the same store)
            if handler in by_handler:
                by_handler[handler][key] = v
                if p is not None:
                    # its home until its records say otherwise: a host silent since the start whose
                    # finding another host's report changes is written home too
                    self._home[handler].setdefault(key, p)
        restored: list[Finding] = []
        for h in self.handlers:
            try:
                found = self._restore_handler(h, by_handler[h.name])
            except Exception as e:  # noqa: BLE001 - a handler's restore bug must not fail every batch for good
                # Before, it escaped: this restore was tried again (and failed) at every batch, none handled.
                # The handler starts empty instead, its keys counted as unreadable.
                log.error("state_restore_failed", handler=h.name, keys=len(by_handler[h.name]),
                          error=f"{type(e).__name__}: {e}"[:500], exc_info=True)
                STATE_DROPPED.labels(h.name, UNREADABLE).inc(len(by_handler[h.name]))
                self._refusal_clears += self._cleared_by_restore(h)   # of keys refused before it failed
                try:
                    found = self._restore_handler(h, {})
                except Exception as e:  # noqa: BLE001 - it fails even empty: it goes on as reset, shows nothing
                    log.error("state_restore_failed", handler=h.name, keys=0, error=f"{type(e).__name__}: {e}"[:500])
                    found = []
            restored += found
        self.sink.restore(restored)   # all at once: the findings shown are exactly those held now
        self._delete_stale_copies(self.changelog_partitions())
        self.needs_restore = False

    def _restore_handler(self, h: DetectorHandler, states: dict[str, Any]) -> list[Finding]:
        """Restore ``h`` from ``states``; its open findings."""
        h.drain_outbox()     # events about the state now replaced (as before, dropped with it)
        h.restore(states)
        h.touched()          # restoring is not a change to write back
        h.fed()
        self._refusal_clears += self._cleared_by_restore(h)
        found = h.open_findings()
        log.info("state_restored", agent=h.name, keys=len(states), open_findings=len(found))
        return found

    @staticmethod
    def _cleared_by_restore(h: DetectorHandler) -> list[Publication]:
        """What the restore put in ``h``'s outbox: the clears of refused keys' open findings
        (``DetectorHandler._refuse``), published with the next batch's findings. Dropped, as the whole
        outbox was before, they were never published: the refused key's pages stayed open for good."""
        return [p for p in h.drain_outbox() if p[0] == CLEARED]

    async def run_batch(self, events: Sequence[EventT]) -> None:
        """Handle one batch: handlers called per source partition, findings sent, touched keys written.

        One handler call per source partition number, so the keys a call's samples fed (``fed``) are
        known to come from that partition: their home, where their table entries must live. The
        other keys a call touched (findings about other hosts, dropped keys) are written to their
        own home, known from earlier records, after every group (a key fed later in the batch is
        known by then). The topics of a partition number share one call: a handler's fixed cost per
        call (gauges, sweeps, books) is then paid once per partition, not once per topic and partition.
        """
        if self.needs_restore:
            self.restore()
        groups: dict[int, list[EventT]] = {}
        for e in events:
            groups.setdefault(e.message.partition, []).append(e)
        # the event of the last group that touched each key: the fallback when its home is unknown
        touched: dict[tuple[DetectorHandler, str], EventT] = {}
        moved: dict[tuple[DetectorHandler, str], int] = {}   # key -> the partition its state lived in
        for partition, group in groups.items():
            await process_batch(self.name, [e.message for e in group], self._all, self._send_deadletter,
                                self._highwater, max_clock_skew_s=self.max_clock_skew_s)
            self._last[partition] = group[-1]
            for h in self.handlers:
                home = self._home[h.name]
                for key in h.fed():
                    old = home.get(key)
                    if old is not None and old != partition:
                        moved.setdefault((h, key), old)
                    home[key] = partition
                for key in h.touched():
                    touched[(h, key)] = group[-1]
        # one publish for every handler (the restore's clears first): one bounded wait for the broker's
        # acknowledgements per batch
        clears, self._refusal_clears = self._refusal_clears, []
        await self.sink.publish([*clears, *(p for h in self.handlers for p in h.drain_outbox())])
        unknown: list[str] = []
        writable = self.changelog_partitions()
        unwritten: dict[int, list[str]] = {}   # partition without a changelog partition -> keys not written
        self._writes = {}
        with gc_paused():   # synchronous: a state dict per touched key, all alive until written
            for (h, key), fallback in touched.items():
                event = self._home_event(h, key)
                if event is None:
                    # Neither fed nor recovered since this worker got its partition (a key first made by
                    # another partition's records), or no event of its home partition seen since: its
                    # state goes where it was touched, as before. Rare; said below.
                    unknown.append(key)
                    event = fallback
                    self._home[h.name].setdefault(key, event.message.partition)   # where it lives now
                if writable is not None and event.message.partition not in writable:
                    # The producer asserts on a partition it does not know, in Faust's buffer task: that
                    # crashed the worker. Kept in memory; its old copy (if any) left as it is.
                    unwritten.setdefault(event.message.partition, []).append(f"{h.name}{KEY_SEP}{key}")
                    continue
                if not self.write_state(h, key, event, moved.get((h, key)), writable) and (h, key) in moved:
                    # not written (too large, or no JSON): its copy stays where it lived, and so does its home, so the
                    # move (the write and the old copy's delete) is made by the first write that goes through
                    self._home[h.name][key] = moved[(h, key)]
        if unwritten:
            self._not_written(unwritten, writable)
        if moved:
            self.home_moved += len(moved)
            health.STATE_HOME_MOVED.labels(self.name).inc(len(moved))
            (h, key), old = next(iter(moved.items()))
            log.warning("state_home_moved", agent=self.name, keys=len(moved), example=f"{h.name}{KEY_SEP}{key}",
                        was=old, now=self._home[h.name].get(key))
        if unknown:
            self.home_unknown += len(unknown)
            health.STATE_HOME_UNKNOWN.labels(self.name).inc(len(unknown))
            log.warning("state_home_unknown", agent=self.name, keys=len(unknown), example=unknown[0])
        # acknowledged before the batch is acked: no commit passes records whose state the broker refused
        await self.confirm_writes(events)

    def _delete_copy(self, handler: DetectorHandler, key: str, partition: int,
                     writable: frozenset[int] | None = None) -> None:
        """Tombstone ``key`` in the partition its state lived in before its records moved (a netperf target set
        measured from another host, power readings keyed by generation, partitions added), with no event of that
        partition needed. Before, it was deleted only under an event of that partition: one that gets no more
        records (the ipmi host partitions after the move to generation keys) never had one, and the old copy stayed
        for good (a restart recovering it last brought back the state from before the move). That partition may
        be another worker's: the delete goes straight to the changelog, its memory there is its own."""
        if writable is not None and partition not in writable:
            return
        self.table.tombstone(handler.name + KEY_SEP + key, partition)

    def _delete_stale_copies(self, writable: frozenset[int] | None) -> None:
        """Tombstone the older copies a recovery found beside the newest one of a key of this worker's partitions
        (:meth:`StateTable.stale_copies`): keys moved before old copies were deleted, or whose delete failed.
        Left, each restart restored one of them only because it was older (the table keeps the newest)."""
        stale = getattr(self.table, "stale_copies", None)   # a table of a test: none
        if stale is None:
            return
        deleted, example = 0, None
        try:
            for table_key, (home, stamp_ms, partitions) in stale().items():
                if self._assigned is not None and home not in self._assigned:
                    continue   # the newest copy is another worker's: its owner deletes the older ones
                for p in sorted(partitions - {home}):
                    if writable is None or p in writable:
                        self.table.tombstone(table_key, p, stamp_ms)
                        deleted, example = deleted + 1, example or table_key
        except Exception as e:  # noqa: BLE001 - the restore goes on; the table keeps the newest copy regardless
            log.error("state_old_copies_delete_failed", agent=self.name, error=f"{type(e).__name__}: {e}"[:500])
        if deleted:
            log.warning("state_old_copies_deleted", agent=self.name, copies=deleted, example=repr(example)[:200],
                        why="a key's older copies in other changelog partitions than its newest (moved keys)")

    def changelog_partitions(self) -> frozenset[int] | None:
        """The state changelog's partitions a write can go to: those the app's producer knows (it asserts on
        any other), else as many as the consumer's metadata says; None: neither knows the topic yet."""
        name = self._changelog_name()
        if name is None:
            return None
        try:
            known = self.app.producer._ensure_producer().client.cluster.partitions_for_topic(name)
        except Exception:  # noqa: BLE001 - producer not started (or another driver): the consumer's view
            known = None
        if known is not None:
            return frozenset(known)
        count = self._topic_partitions(name)
        return None if count is None else frozenset(range(count))

    def _changelog_name(self) -> str | None:
        topic = getattr(self.table, "changelog_topic", None)   # None: a table without one (a test's)
        return None if topic is None else topic.get_topic_name()

    def _topic_partitions(self, topic: str | None) -> int | None:
        if topic is None:
            return None
        try:
            return self.app.consumer.topic_partitions(topic)
        except Exception:  # noqa: BLE001 - consumer not started yet: not known
            return None

    def _not_written(self, unwritten: dict[int, list[str]], writable: frozenset[int] | None) -> None:
        """Count and say the batch's state writes skipped for want of a changelog partition; ask the producer
        for fresh metadata when the consumer already sees more changelog partitions (the changelog grown)."""
        keys = sum(len(v) for v in unwritten.values())
        self.not_written += keys
        health.ERRORS.labels(self.name).inc()   # per batch, as handler errors: OpsloopStreamHandlerErrors
        name = self._changelog_name()
        count = self._topic_partitions(name)
        NOT_WRITTEN_LOG.error(log, "state_not_written", key=self.name, agent=self.name, keys=keys,
                              partitions=sorted(unwritten), changelog=name,
                              changelog_partitions=None if writable is None else len(writable),
                              example=next(iter(unwritten.values()))[0],
                              why="records of a source partition the state changelog has no partition of: "
                                  "grow the telemetry topics and the changelog to the same partition count",
                              kept="in memory only: a restart or a rebalance starts these keys afresh")
        if count is not None and writable is not None and count > len(writable):
            self._refresh_producer_metadata()

    def _refresh_producer_metadata(self) -> None:
        now = time.monotonic()
        if now - self._refreshed_at < METADATA_REFRESH_S:
            return
        self._refreshed_at = now
        try:
            fut = asyncio.ensure_future(self.app.producer._ensure_producer().client.force_metadata_update())
        except Exception as e:  # noqa: BLE001 - the next refused batch asks again
            log.warning("producer_metadata_refresh_failed", error=f"{type(e).__name__}: {e}")
            return
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())   # retrieved: no "never retrieved"

    def _check_partition_counts(self) -> None:
        """Log each source topic whose partition count is not the state changelog's (after an assignment):
        the state of its partitions beyond the changelog's is not written, and its keys' state may be held
        by another worker than their records (Faust assigns a table's partitions with the topics of its count)."""
        name = self._changelog_name()
        changelog = self._topic_partitions(name)
        if changelog is None:
            return
        counts = {t: n for t in sorted(self._source_topics) if (n := self._topic_partitions(t)) is not None}
        differ = {t: n for t, n in counts.items() if n != changelog}
        if differ:
            log.error("state_partitions_mismatch", changelog=name, changelog_partitions=changelog, topics=differ,
                      why="a source topic's partitions added or removed without the changelog's: grow the "
                          "telemetry topics and the changelog to the same partition count")

    def _home_event(self, handler: DetectorHandler, key: str) -> EventT | None:
        """The latest event of ``key``'s home partition (None: home not known or not assigned)."""
        p = self._home[handler.name].get(key)
        return None if p is None else self._last.get(p)

    def record_size(self, table_key: str, state: Any) -> int | None:
        """The size the producer gives ``table_key``'s changelog record (None: a table without a changelog).

        Serialised as the table's write does (the changelog topic's ``prepare_*`` with the table's codecs) and
        weighed as aiokafka weighs it before it sends (``estimate_size_in_bytes``: key, value, headers, record and
        batch overhead), so the guard refuses exactly what the producer would."""
        topic = getattr(self.table, "changelog_topic", None)
        if topic is None:
            return None
        headers = topic.prepare_headers(None)
        k, headers = topic.prepare_key(table_key, self.table.key_serializer, None, headers)
        v, headers = topic.prepare_value(state, self.table.value_serializer, None, headers)
        listed = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
        return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(k, v, listed))

    def _too_large(self, handler: DetectorHandler, key: str, size: int) -> None:
        self.too_large += 1
        STATE_DROPPED.labels(handler.name, TOO_LARGE).inc()   # per refused write: alerted while it lasts
        TOO_LARGE_LOG.error(log, "state_too_large", key=handler.name, handler=handler.name, state_key=key[:200],
                            size=size, limit=self.max_record_bytes,
                            why="the key's state is larger than one Kafka record may be (Faust's "
                                "producer_max_request_size): its detector keeps too much for it",
                            kept="in memory only, its older copy (if any) left in the changelog: a restart or "
                                 "a rebalance brings that one back, or none")

    def write_state(self, handler: DetectorHandler, key: str, event: EventT, moved_from: int | None = None,
                    writable: frozenset[int] | None = None) -> bool:
        """Write ``key``'s state (a tombstone when the handler forgot it) under ``event``; ``moved_from``: the
        partition its copy lived in before its records moved (deleted there, not when this write is refused).
        False: not written (its state could not be serialised, or is too large for one record)."""
        try:
            state = handler.state_of(key)
        except Exception as e:  # noqa: BLE001 - one bad key must not lose the others
            log.error("state_serialise_failed", agent=handler.name, key=key, error=f"{type(e).__name__}: {e}")
            return False
        table_key = handler.name + KEY_SEP + key
        if state is not None:
            try:
                size = self.record_size(table_key, state)
            except Exception as e:  # noqa: BLE001 - no JSON for it: the table's write would raise out of the batch
                log.error("state_serialise_failed", agent=handler.name, key=key, error=f"{type(e).__name__}: {e}")
                return False
            if size is not None and size > self.max_record_bytes:
                # Sent, aiokafka raised MessageSizeTooLargeError in Faust's producer buffer task: the worker
                # crashed (every detector), the batch's state writes lost with it.
                self._too_large(handler, key, size)
                return False
        take_sent = getattr(self.table, "take_sent", None)   # a table of a test: none
        if take_sent is not None:
            take_sent()   # sent before (a restore's deletes of stale copies): not this key's write
        if moved_from is not None:
            self._delete_copy(handler, key, moved_from, writable)
        recovered = self._store_partitions()
        with _as_current(event):
            if state is None:
                self._home[handler.name].pop(key, None)   # forgotten: bounded with the handler's state
                if table_key in self.table:
                    del self.table[table_key]
                if recovered is not None:
                    recovered.pop(table_key, None)
            else:
                self.table[table_key] = state
                if recovered is not None:
                    # Faust drops a key after a recovery by this map: by its home, as assign() does (a key
                    # written elsewhere for want of its home's event stays while its home is ours)
                    recovered[table_key] = self._home[handler.name].get(key, event.message.partition)
        if take_sent is not None:
            self._writes[(handler, key)] = (event, take_sent())   # awaited before the batch is acked
        return True

    def _producer_gone(self) -> bool:
        """Whether the app's producer buffer is not running (never started, crashed or stopping) or the app stops: a
        write still in it will not be delivered, or the worker is on its way out (the batch is read again)."""
        buffer = getattr(getattr(self.app, "_producer", None), "buffer", None)
        if buffer is None or not buffer.started or buffer.crashed or buffer.should_stop:
            return True
        return self._stopping()

    async def confirm_writes(self, batch: Sequence[EventT]) -> None:
        """Wait for the broker to acknowledge this batch's state writes before the batch is acked (its offsets
        committable). Before, Faust's commit waited for them to end, not to succeed: a write the broker refused
        (over the changelog's ``max.message.bytes``, ...) left only a warning of Faust's, the offsets were committed,
        and a restart restored the key's older copy, the records that built the newer state never replayed.

        The wait lasts as long as the producer holds the writes: a broker away keeps them in aiokafka, delivered when
        it is back (before, they were given up after 60 s: counted failed and dead-lettered for a loss that did not
        happen, and the offsets committed before the state was written). Past :data:`STATE_CONFIRM_S` the wait is
        logged once (``state_writes_waiting``) and shown (:data:`STATE_WAITING`). A refused write (its future failed:
        the broker refused it, or aiokafka gave up on it) is written again (the key's state now), one key at a time:
        the broker refuses a producer batch whole, so one record over the topic's limit failed the keys sent with it.
        Still refused after :data:`STATE_WRITE_ATTEMPTS`, it is logged, counted and dead-lettered, kept in memory
        (written again by the next batch touching the key), and the batch goes on: a write that can never succeed
        does not hold its partition. A producer that is not running or an app
        that stops (or a cancellation) during the wait: the batch is left unacked (``leave_unacked``), read again
        after the restart, and the stop is not held up."""
        writes, self._writes = self._writes, {}
        if not writes:
            return
        failed: dict[tuple[DetectorHandler, str], tuple[EventT, BaseException]] = {}
        try:
            for attempt in range(1, STATE_WRITE_ATTEMPTS + 1):
                if attempt > 1:
                    await asyncio.sleep(STATE_RETRY_PAUSE_S)
                    writes = await self._write_again(failed)
                futs = [f for _, fs in writes.values() for f in fs]
                if not await self._delivered(futs, len(writes), len(batch)):
                    self._unconfirmed(batch, len(writes))
                    return
                failed = {k: (event, error) for k, (event, fs) in writes.items()
                          if (error := _write_error(fs)) is not None}
                if not failed:
                    return
                self._write_failed(failed, attempt)
        except asyncio.CancelledError:
            self._unconfirmed(batch, len(writes))   # the agent stops: take_batches would ack the batch
            raise
        await send_deadletters(self.name, (_state_deadletter(h, key, event, error)
                                           for (h, key), (event, error) in failed.items()), self._send_deadletter)

    async def _write_again(self, failed: Mapping[tuple[DetectorHandler, str], tuple[EventT, BaseException]]
                           ) -> dict[tuple[DetectorHandler, str], tuple[EventT, list[FutureMessage]]]:
        """Write the refused keys again, each awaited before the next (a producer batch of its own); those a guard
        refuses now are left out (the guard said why)."""
        writes: dict[tuple[DetectorHandler, str], tuple[EventT, list[FutureMessage]]] = {}
        writable = self.changelog_partitions()
        for (h, key), (event, _) in failed.items():
            # the key's state now (a batch is handled whole before the next)
            if self.write_state(h, key, event, None, writable):
                writes[(h, key)] = self._writes.pop((h, key))
                if not await self._delivered(writes[(h, key)][1], 1, 0):
                    break   # the producer is gone: said by the caller's wait
        self._writes = {}
        return writes

    def _write_failed(self, failed: Mapping[tuple[DetectorHandler, str], tuple[EventT, BaseException]],
                      attempt: int) -> None:
        self.write_failures += len(failed)
        health.ERRORS.labels(self.name).inc()   # per batch and attempt, as handler errors
        for (h, key), (_, error) in failed.items():
            WRITE_FAILED_LOG.error(log, "state_write_failed", key=h.name, agent=self.name, handler=h.name,
                                   state_key=key[:200], attempt=attempt, attempts=STATE_WRITE_ATTEMPTS,
                                   error=f"{type(error).__name__}: {error}"[:300])

    def _unconfirmed(self, batch: Sequence[EventT], keys: int) -> None:
        if isinstance(batch, list):   # the list take_batches handed out
            leave_unacked(batch)
        if self._stopping():
            log.warning("state_writes_unconfirmed", agent=self.name, keys=keys,
                        why="the worker stops before the broker acknowledged the batch's state",
                        kept="the batch's offsets not committed: it is read again after the restart")
            return
        health.ERRORS.labels(self.name).inc()
        log.error("state_writes_unconfirmed", agent=self.name, keys=keys,
                  why="the producer crashed or stops before the broker acknowledged the batch's state",
                  kept="the batch's offsets not committed: it is read again after the restart")

    def _stopping(self) -> bool:
        return bool(getattr(self.app, "should_stop", False))

    async def _delivered(self, futs: list[FutureMessage], keys: int, records: int) -> bool:
        """Wait until ``futs`` are done, as long as the producer holds them; False: the producer or the app stops
        first. Past :data:`STATE_CONFIRM_S`, said once and shown in :data:`STATE_WAITING` until they are done."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting = [f for f in futs if not f.done()]
        said = False
        try:
            while waiting:
                if self._producer_gone():
                    return False
                waited = loop.time() - started
                if not said and waited >= STATE_CONFIRM_S:
                    said = True
                    log.warning("state_writes_waiting", agent=self.name, keys=keys, writes=len(waiting),
                                records=records, waited_s=round(waited, 1),
                                why="the broker has not acknowledged the batch's state writes (away, or not taking "
                                    "them); the producer keeps them and sends them again",
                                kept="the batch and its offsets wait for them: nothing is committed before its state")
                if said:
                    STATE_WAITING.labels(self.name).set(len(waiting))
                look = STATE_LOOK_S if said else min(STATE_LOOK_S, max(STATE_CONFIRM_S - waited, 0.0))
                await asyncio.wait(waiting, timeout=look)
                waiting = [f for f in waiting if not f.done()]
        finally:
            if said:
                STATE_WAITING.labels(self.name).set(0)
        if said:
            log.info("state_writes_confirmed", agent=self.name, keys=keys,
                     waited_s=round(loop.time() - started, 1))
        return True


def _write_error(futs: Sequence[FutureMessage]) -> BaseException | None:
    """Why a key's writes did not all reach the broker (None: they did); retrieves each failure (no asyncio
    "exception was never retrieved" at exit)."""
    for f in futs:
        if not f.done():   # not reached: awaited until done, or the batch left unacked
            return TimeoutError("no acknowledgement")
        if f.cancelled():
            return asyncio.CancelledError("state write cancelled")
        if (error := f.exception()) is not None:
            return error
    return None


def _state_deadletter(handler: DetectorHandler, key: str, event: EventT, error: BaseException) -> DeadLetter:
    """A state write given up: named by the latest record of the key's partition in the batch (the state itself
    may be what the changelog refuses: not carried)."""
    msg = event.message
    return DeadLetter(f"state write of {handler.name}{KEY_SEP}{key} not acknowledged: {type(error).__name__}: {error}",
                      msg.topic, msg.partition, msg.offset, msg.key,
                      {"handler": handler.name, "state_key": key, "error": f"{type(error).__name__}: {error}"[:300],
                       "kept": "in memory; written again by the next batch touching the key"}, value_is="summary")


def detector_agent(app: faust.App, handlers: Sequence[DetectorHandler], settings: Settings, table: faust.Table,
                   sink: FindingsSink) -> StatefulAgent:
    agent = StatefulAgent(app, handlers, settings, table, sink)
    agent.register()
    return agent
