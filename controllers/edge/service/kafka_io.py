"""Kafka side of the service: publishing decisions and findings, recovering the last decision.

A decision whose weights records were not all acknowledged raises :class:`PublishError` (naming the
keys that were), so the loop keeps what was published, not what it meant to publish.

Restart recovery keeps the highest ``(epoch, version)`` per ``listener|edge`` key of ``edge.weights``, so a
restarted controller continues the version sequence (actuators refuse older versions) and damps from the
weights in force, not from scratch. The topic is not compacted (one record per key per tick: ~40k per key a
week), so it is read from each partition's end backwards, in chunks doubling from :data:`FIRST_CHUNK`, until
every key the service expects (the topology's pairs) has a record, every partition is read to its beginning,
or the deadline. Before, it was read from the beginning and a deadline hit returned the OLDEST records (old
versions, old weights to damp from) without a word; now a cut read keeps the newest, and a cut read or an
expected key not found is logged ``recover_incomplete`` (the key's edge starts fresh: ``loop.py``). Once
every expected key is found, what lies further back is not read: an older instance still publishing after its
successor (the actuators refuse it) could hide the successor's higher stamp there.
A record that does not decode is skipped, logged with its offset and why (a version or epoch beyond the record's
ranges is refused at decode, :mod:`opsloop.records.edge`; one line per kind of rejection, all counted in
``recover_done``), and so is one the service could not continue from: an epoch of exactly
:data:`LAST_EPOCH` (this instance takes one more than the highest recovered) or a version above
:data:`MAX_RECOVERED_VERSION`. Such a record recovered (2**64 - 1, then valid to the schema), every record
the service made after it carried 2**64 and failed to encode: every publish failed, for good.
So is one whose epoch is more than ``max_epoch_ahead_s`` (:data:`MAX_EPOCH_AHEAD_S`) ahead of this host's clock
(kind ``epoch_ahead``): a controller started with its clock a year ahead, or a hand-made record. Chased, this
instance took its epoch + 1 and the actuators, which refuse an epoch beyond their ``max_clock_skew_s``, refused
every decision it made; skipped, the key's newest sane record is kept (the read goes on back for it).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from kafka import KafkaConsumer, TopicPartition

from opsloop.records import EdgeWeights
from opsloop.records.edge import LAST_EPOCH
from opsloop.controllers.edge.service import metrics as M
from opsloop.controllers.edge.service.inputs import MAX_CLOCK_SKEW_S
from opsloop.config import KafkaSettings
from opsloop.records import Finding
from opsloop.kafka_clients import client_options, kafka_settings, send_deadletter, service_producer
from opsloop.log import get_logger
from opsloop.topics import Topic

log = get_logger("controller.edge.kafka")
# The largest version recovered: one a second for 285 million years, and far enough below the 2**63 - 1 the
# actuators keep for the sequence to go on from it (every JSON reader holds it exactly, a double's 2**53).
MAX_RECOVERED_VERSION = 2 ** 53
# Records read back from each partition's end in the first step of a recovery, doubled at each step back (at
# least one per expected key): one record per key per tick puts every key's newest in the last few chunks.
FIRST_CHUNK = 256
MISSING_SHOWN = 5   # missing keys named in recover_incomplete
# How far ahead of this host's clock a recovered epoch may be and still be continued from. An epoch the actuators
# took (within their max_clock_skew_s, 5 s by default, of their clock) may be up to twice that ahead of ours when
# both clocks are off by the bound: not chasing it left this instance below it, refused for good; chasing an epoch
# they refused costs at most that many seconds of refusals.
MAX_EPOCH_AHEAD_S = 2 * MAX_CLOCK_SKEW_S


class PublishError(RuntimeError):
    """Records of a decision were not acknowledged; ``delivered``: the ``listener|edge`` keys that were
    (the others may still arrive later: at-least-once)."""

    def __init__(self, message: str, delivered: set[str] | None = None) -> None:
        super().__init__(message)
        self.delivered = set(delivered or ())


class DecisionPublisher:
    def __init__(self, kafka: KafkaSettings | str, client_id: str = "opsloop-edge-controller",
                 flush_timeout_s: float = 5.0) -> None:
        self.kafka = kafka_settings(kafka)   # a bootstrap string means PLAINTEXT, no topic prefix
        self.producer = service_producer(self.kafka, client_id, linger_ms=0, request_timeout_ms=10_000,
                                         max_block_ms=5_000)
        self.flush_timeout_s = flush_timeout_s

    def __call__(self, records: list[EdgeWeights], findings: list[Finding]) -> None:
        """Send and flush; :class:`PublishError` when a weights record was not acknowledged, so the
        loop does not take an unpublished decision for the weights in force (a finding lost is only
        counted: the next tick re-publishes the open ones)."""
        sent = [(f"{r.listener}|{r.edge}", self._send(self.kafka.topic(Topic.EDGE_WEIGHTS),
                                                      f"{r.listener}|{r.edge}", r.encode())) for r in records]
        for f in findings:
            self._send(self.kafka.topic(Topic.FINDINGS), f.id, f.encode())
        flush_error = ""
        try:
            self.producer.flush(timeout=self.flush_timeout_s)
        except Exception as e:  # noqa: BLE001 - reported below, per record
            flush_error = f"; flush: {type(e).__name__}: {e}"
            log.warning("publish_flush_failed", error=f"{type(e).__name__}: {e}")
        delivered = {key for key, fut in sent if fut is not None and fut.succeeded()}
        missing = [key for key, _ in sent if key not in delivered]
        if missing:
            raise PublishError(f"{len(missing)} of {len(sent)} edge.weights record(s) not acknowledged "
                               f"({', '.join(missing[:5])}){flush_error}"[:500], delivered)

    def _send(self, topic: str, key: str, value: bytes) -> Any:
        """The record's future, None when the producer refused it (counted and logged)."""
        try:
            fut = self.producer.send(topic, key=key.encode(), value=value)
        except Exception as e:  # noqa: BLE001 - buffer full / metadata timeout: count, never raise
            M.PUBLISH_ERRORS.labels(topic).inc()
            log.warning("publish_failed", topic=topic, key=key, error=f"{type(e).__name__}: {e}")
            return None
        fut.add_errback(lambda e: (M.PUBLISH_ERRORS.labels(topic).inc(),
                                   log.warning("publish_failed", topic=topic, key=key, error=str(e))))
        return fut

    def deadletter(self, record: Any, reason: str) -> None:
        """Keep a consumed record that was refused (``record``: a Kafka consumer record) on the
        dead-letter topic, in the stream stage's shape. Never raises (a broker hiccup is logged)."""
        send_deadletter(self.producer, self.kafka, reason, source_topic=record.topic,
                        partition=record.partition, offset=record.offset, key=record.key,
                        value=record.value, stage="edge-control", log=log,
                        headers=getattr(record, "headers", None), value_is="record")

    def close(self) -> None:
        self.producer.close(timeout=5)


def recover_decisions(kafka: KafkaSettings | str, topic: str = Topic.EDGE_WEIGHTS.value, timeout_s: float = 15.0,
                      expected: Iterable[tuple[str, str]] | None = None, *,
                      max_epoch_ahead_s: float = MAX_EPOCH_AHEAD_S,
                      clock: Callable[[], float] = time.time) -> dict[tuple[str, str], EdgeWeights]:
    """The record with the highest ``(epoch, version)`` per (listener, edge) in ``topic`` (a base name:
    ``kafka.topic_prefix`` is applied), read from each partition's end backwards (module docstring).
    ``expected``: the (listener, edge) pairs the service runs; the read stops once each has a record (None:
    back to every partition's beginning). Keys not expected are returned too when read. A record whose epoch is
    more than ``max_epoch_ahead_s`` ahead of ``clock`` (wall clock: an epoch is a date) is skipped."""
    k = kafka_settings(kafka)
    topic = k.topic(topic)
    want = None if expected is None else set(expected)
    started = time.monotonic()
    deadline = started + timeout_s
    scan = _Scan(topic, int((clock() + max_epoch_ahead_s) * 1000))
    cut = False
    # earliest: a chunk start that retention removed meanwhile is read from the new beginning, not skipped to the end;
    # fetch_max_wait_ms: a fetch left at a partition's end held each next step 500 ms (the broker's wait for data)
    consumer = KafkaConsumer(**client_options(k), group_id=None, enable_auto_commit=False, fetch_max_wait_ms=50,
                             auto_offset_reset="earliest", client_id="opsloop-edge-recover")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if tps:
            consumer.assign(tps)   # for the offsets; each step assigns the partitions it reads
            begin = consumer.beginning_offsets(tps)
            upto = consumer.end_offsets(tps)   # per partition, where the part not yet read ends
            chunk = max(FIRST_CHUNK, len(want or ()))
            while not (want is not None and want <= scan.out.keys()):
                todo = {tp: max(begin[tp], upto[tp] - chunk) for tp in tps if upto[tp] > begin[tp]}
                if not todo:
                    break
                if not _read_back(consumer, todo, upto, scan, deadline):
                    cut = True
                    break
                upto.update(todo)
                chunk *= 2
    finally:
        consumer.close()
    missing = sorted(want - scan.out.keys()) if want is not None else []
    seconds = round(time.monotonic() - started, 3)
    if cut or missing:
        # those edges start fresh (loop.py); a cut read may also have kept an older record of a key found
        log.warning("recover_incomplete", topic=topic, cause="deadline" if cut else "not_on_topic",
                    timeout_s=timeout_s, keys_found=len(scan.out), keys_missing=len(missing),
                    missing=[f"{lst}|{edge}" for lst, edge in missing[:MISSING_SHOWN]], records_read=scan.read,
                    seconds=seconds)
    log.info("recover_done", topic=topic, keys=len(scan.out), records_read=scan.read,
             rejected=sum(scan.rejected.values()), rejected_by_kind=dict(scan.rejected), complete=not (cut or missing),
             seconds=seconds)
    return scan.out


def _read_back(consumer: KafkaConsumer, starts: dict[TopicPartition, int], stops: dict[TopicPartition, int],
               scan: "_Scan", deadline: float) -> bool:
    """Read offsets ``[starts[tp], stops[tp])`` of each partition of ``starts`` into ``scan``; False when the
    deadline came first. A partition done leaves the assignment (no fetch on past its span). Not paused: kafka-python
    3.0 parks what it fetched for a paused partition and, resumed while another's drained records hold its in-line
    slot, never fetches it again (polls came back empty until the deadline, 2 of 3 partitions unread)."""
    consumer.assign(sorted(starts))
    for tp, start in starts.items():
        consumer.seek(tp, start)
    left = set(starts)
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        for tp, records in consumer.poll(timeout_ms=int(min(500.0, remaining * 1000)) + 1).items():
            for r in records:
                if r.offset < stops.get(tp, 0):   # a fetch runs on past the span: read in an earlier chunk
                    scan.take(r)
        timeout_ms = max(1, int((deadline - time.monotonic()) * 1000))
        positions = {tp: consumer.position(tp, timeout_ms=timeout_ms) for tp in left}
        done = {tp for tp, at in positions.items() if at is not None and at >= stops[tp]}   # None: a reset under way
        if done:
            left -= done
            if left:
                consumer.assign(sorted(left))
    return True


class _Scan:
    """What the read keeps: per key the usable record with the highest stamp (the later offset on a tie),
    and the rejected records counted per kind, the first of each kind logged."""

    def __init__(self, topic: str, max_epoch: int = LAST_EPOCH) -> None:
        self.topic = topic
        self.max_epoch = max_epoch   # a later epoch is too far ahead of this host's clock to continue from
        self.out: dict[tuple[str, str], EdgeWeights] = {}
        self._offset: dict[tuple[str, str], int] = {}
        self.read = 0
        self.rejected: dict[str, int] = {}

    def take(self, r: Any) -> None:
        self.read += 1
        try:
            rec = EdgeWeights.decode(r.value)
        except ValueError as e:
            self._reject(r, _decode_kind(r.value, str(e)), str(e))
            return
        unusable = not_recoverable(rec)
        if unusable:
            self._reject(r, "epoch" if rec.epoch >= LAST_EPOCH else "version", unusable)
            return
        if rec.epoch > self.max_epoch:
            self._reject(r, "epoch_ahead", f"edge weights record {rec.listener}|{rec.edge}: epoch {rec.epoch} is "
                                           f"{(rec.epoch - self.max_epoch) / 1000:.1f}s beyond the {self.max_epoch} "
                                           "this instance continues from (its clock + max_epoch_ahead_s): a "
                                           "controller clock was wrong or the record is no controller's")
            return
        key = (rec.listener, rec.edge)
        if key not in self.out or (rec.stamp, r.offset) > (self.out[key].stamp, self._offset[key]):
            self.out[key] = rec
            self._offset[key] = r.offset

    def _reject(self, r: Any, kind: str, error: str) -> None:
        self.rejected[kind] = self.rejected.get(kind, 0) + 1
        if self.rejected[kind] == 1:   # one line per kind, the rest counted in recover_done: a topic of garbage
            log.warning("recover_record_rejected", topic=self.topic, partition=r.partition, offset=r.offset,
                        kind=kind, error=error[:300])


def _decode_kind(raw: bytes | None, error: str) -> str:
    """The kind of a record that did not decode, for :class:`_Scan`'s one line per kind."""
    if not raw:
        return "empty"
    if ": not JSON" in error or "expected a JSON object" in error:
        return "not_json"
    return "schema"


def not_recoverable(rec: EdgeWeights) -> str:
    """Why the service cannot continue from ``rec`` (its stamp: module docstring), or "" when it can."""
    if rec.epoch >= LAST_EPOCH:   # a later one is refused at decode; this one leaves no epoch for this instance
        return (f"edge weights record {rec.listener}|{rec.edge}: epoch {rec.epoch} leaves no later epoch for this "
                f"instance (the last is {LAST_EPOCH}: 9999-12-31 in ms)")
    if rec.version > MAX_RECOVERED_VERSION:
        return (f"edge weights record {rec.listener}|{rec.edge}: version {rec.version} is above "
                f"{MAX_RECOVERED_VERSION}: no controller counted that far")
    return ""
