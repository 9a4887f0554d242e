"""Batch processing of telemetry records: the shape every stream agent here uses.

Faust's per-message machinery (an event object and a coroutine hop per record) costs ~50x a plain
consumer loop, so agents take records in batches (``streams/runtime/take.py``: a short window when caught
up, a longer one behind a backlog), decode them with orjson +
pydantic, route what does not validate to the dead-letter topic with the reason, and hand the good samples of the whole batch
to a plain-Python handler in one call. Handlers keep their hot state in memory and write tables
(changelogs) at most once per batch and key, never per sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from operator import attrgetter
from typing import Any, Awaitable, Callable, Hashable, Iterable, Iterator, Mapping, Protocol, Sequence

import orjson
from prometheus_client import Counter

from opsloop.deadletter_metrics import DEADLETTER_SEND_FAILURES
from opsloop.log import Sampled, get_logger
from opsloop.records import DEADLETTER_VALUE_LIMIT, Metric, deadletter_record
from opsloop.records.deadletter import ValueIs, replayed_from_header
from opsloop.wire import Parsed, Rejected, parse_record
from opsloop.streams.runtime import health

log = get_logger("stream")
# a poison topic dead-letters every record: one log line a minute per agent (the counter counts each)
DEADLETTER_LOG = Sampled(60.0)
DEADLETTER_LOST_LOG = Sampled(60.0)
# the stage its dead letters carry (deadletter_record's default): their failures' label
DEADLETTER_STAGE = "stream"


@dataclass(slots=True)
class DeadLetter:
    reason: str
    topic: str
    partition: int | None
    offset: int | None
    key: bytes | None
    value: Any
    # the refused record's opsloop-replayed-from header: a replay refused again, not a new failure
    replayed_from: str | None = None
    value_is: ValueIs | None = None   # what ``value`` holds (record, sample, samples, summary)

    def encode(self) -> bytes:
        """The dead-letter record, bounded: Kafka refuses a message over 1 MB, and a dead letter lost so
        is a bad record with no trace. The reason is cut to :data:`DEADLETTER_REASON_CHARS`; the key
        (``deadletter_record`` cuts it to ``DEADLETTER_KEY_BYTES`` and says so); a value
        that is not the raw record (whose bytes ``deadletter_record`` cuts itself) is cut to an
        excerpt of :data:`DEADLETTER_VALUE_LIMIT` bytes, flagged ``truncated`` with its ``value_bytes``."""
        reason = self.reason
        if len(reason) > DEADLETTER_REASON_CHARS:
            reason = f"{reason[:DEADLETTER_REASON_CHARS]}... ({len(reason) - DEADLETTER_REASON_CHARS} characters cut)"
        value = self.value
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogatepass")   # cut (and flagged) like raw bytes
        where = {"topic": self.topic, "partition": self.partition, "offset": self.offset, "key": self.key,
                 "replayed_from": self.replayed_from, "value_is": self.value_is}
        if value is None or isinstance(value, bytes):
            return deadletter_record(reason, value=value, **where)
        text = orjson.dumps(value, default=str)
        if len(text) <= DEADLETTER_VALUE_LIMIT:
            return deadletter_record(reason, value=value, **where)
        # rare (an oversize sample a handler refused): the record made without the value, then the excerpt
        doc = orjson.loads(deadletter_record(reason, value=None, **where))
        doc["value"] = text[:DEADLETTER_VALUE_LIMIT].decode("utf-8", "ignore")
        doc["truncated"] = True
        doc["value_bytes"] = len(text)
        return orjson.dumps(doc)


@dataclass(slots=True)
class DecodedBatch:
    metrics: list[Metric] = field(default_factory=list)
    deadletters: list[DeadLetter] = field(default_factory=list)
    records: int = 0
    # (topic, partition) -> highest offset seen in this batch
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    # source topic -> (records, valid samples, newest sample time): the health accounting, counted
    # per record as it is decoded rather than per sample afterwards
    per_topic: dict[str, list[float]] = field(default_factory=dict)


class RawMessage(Protocol):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


# Bounds of one record's dead letter: a 1 MB record with 20,000 bad samples gives one dead letter
# naming the first few reasons and carrying a bounded excerpt, not 20,000 records.
DEADLETTER_REASONS = 5
DEADLETTER_SAMPLES = 20
DEADLETTER_SAMPLE_CHARS = 2000
# ... and of every dead letter's reason (DEADLETTER_VALUE_LIMIT bounds its value, DEADLETTER_KEY_BYTES its key):
# with them it stays far below Kafka's 1 MB message limit
DEADLETTER_REASON_CHARS = 4096
DEFAULT_MAX_CLOCK_SKEW_S = 300.0

REJECTED_SAMPLES = Counter("opsloop_stream_rejected_samples_total",
                           "Samples dropped at decode, by why (invalid: fails the wire format; "
                           "future: stamped beyond stream.max_clock_skew_s ahead of the worker's clock)",
                           ["topic", "reason"])


_NAME = attrgetter("name")
_TIMESTAMP = attrgetter("timestamp")


def decode_messages(messages: Iterable[RawMessage], now: float | None = None,
                    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
                    on_samples: Callable[[list[Metric]], None] | None = None) -> DecodedBatch:
    """Decode raw Kafka messages; bad records/samples become dead letters, good samples are kept in order.

    A sample stamped more than ``max_clock_skew_s`` after ``now`` is rejected like an invalid one.
    Each record yields at most one dead letter, however many of its samples were bad.
    ``on_samples`` gets each record's good samples as soon as they are decoded (a :class:`FanOut`
    splits them by name there, while they are still in the CPU's cache).
    """
    out = DecodedBatch()
    latest_ok = (time.time() if now is None else now) + max_clock_skew_s
    for msg in messages:
        out.records += 1
        tp = (msg.topic, msg.partition)
        if msg.offset > out.offsets.get(tp, -1):
            out.offsets[tp] = msg.offset
        acc = out.per_topic.get(msg.topic)
        if acc is None:
            acc = out.per_topic[msg.topic] = [0, 0, 0.0]
        acc[0] += 1
        value = msg.value
        if value is None:
            out.deadletters.append(DeadLetter("record has no value (tombstone)", msg.topic, msg.partition,
                                              msg.offset, msg.key, None, _replayed_from(msg), "record"))
            continue
        if not isinstance(value, (bytes, str)):
            value = bytes(value)
        parsed = parse_record(value)
        rejected = parsed.rejected
        if rejected:
            REJECTED_SAMPLES.labels(msg.topic, "invalid").inc(len(rejected))
        good = parsed.metrics
        newest = max(map(_TIMESTAMP, good)) if good else 0.0
        if newest > latest_ok:
            good, future = _split_future(parsed, latest_ok, max_clock_skew_s)
            REJECTED_SAMPLES.labels(msg.topic, "future").inc(len(future))
            rejected = rejected + future
            newest = max(map(_TIMESTAMP, good)) if good else 0.0
        if good:
            out.metrics.extend(good)
            acc[1] += len(good)
            acc[2] = max(acc[2], newest)
            if on_samples is not None:
                on_samples(good)
        if rejected:
            out.deadletters.append(_record_deadletter(msg, value, rejected, len(good)))
    return out


def _split_future(parsed: Parsed, latest_ok: float, skew: float) -> tuple[list[Metric], list[Rejected]]:
    """The samples stamped no later than ``latest_ok``, and a rejection naming each one that is."""
    bad_indices = {r.index for r in parsed.rejected}
    # Position of each valid sample in the record (the parser drops the invalid ones from the list).
    positions = [i for i in range(len(parsed.metrics) + len(bad_indices)) if i not in bad_indices]
    good: list[Metric] = []
    future: list[Rejected] = []
    for m, i in zip(parsed.metrics, positions):
        if m.timestamp <= latest_ok:
            good.append(m)
            continue
        where = f"metrics.{i}.timestamp" if parsed.batch else "timestamp"
        future.append(Rejected(
            f"{where}: {m.timestamp!r} is {m.timestamp - latest_ok + skew:.0f} s ahead of the stream worker's "
            f"clock (more than stream.max_clock_skew_s = {skew:g}); check the source's clock (name {m.name!r})",
            m.to_dict(), i if parsed.batch else None))
    return good, future


def _record_deadletter(msg: RawMessage, value: bytes | str, rejected: list[Rejected], kept: int) -> DeadLetter:
    """One dead letter for all that was wrong with one record: the first reasons and a bounded excerpt."""
    if len(rejected) == 1:
        rej = rejected[0]
        if rej.index is None:   # the record itself refused: its bytes, replayable once fixed
            return DeadLetter(rej.reason, msg.topic, msg.partition, msg.offset, msg.key, value,
                              _replayed_from(msg), "record")
        return DeadLetter(rej.reason, msg.topic, msg.partition, msg.offset, msg.key, _excerpt(rej.raw),
                          _replayed_from(msg), "sample")
    reasons = "; ".join(r.reason for r in rejected[:DEADLETTER_REASONS])
    more = len(rejected) - DEADLETTER_REASONS
    reason = (f"{len(rejected)} of {len(rejected) + kept} samples rejected ({kept} kept): {reasons}"
              + (f"; ... and {more} more" if more > 0 else ""))
    excerpt = {"rejected_samples": len(rejected), "kept_samples": kept,
               "first_rejected": [{"index": r.index, "reason": r.reason[:300], "sample": _excerpt(r.raw)}
                                  for r in rejected[:DEADLETTER_SAMPLES]]}
    return DeadLetter(reason, msg.topic, msg.partition, msg.offset, msg.key, excerpt, _replayed_from(msg), "samples")


def _replayed_from(msg: RawMessage) -> str | None:
    """The record's opsloop-replayed-from header (Faust's and kafka-python's messages carry ``headers``)."""
    return replayed_from_header(getattr(msg, "headers", None))


def _excerpt(raw: Any) -> Any:
    text = orjson.dumps(raw, default=str)
    if len(text) <= DEADLETTER_SAMPLE_CHARS:
        return raw
    return text[:DEADLETTER_SAMPLE_CHARS].decode("utf-8", "backslashreplace") + "..."


class Handler(Protocol):
    """Plain-Python processing of one batch of valid samples (no I/O, no awaits)."""

    name: str
    # Optional ``names: frozenset[str] | None``: the metric names the handler reads. Under a
    # :class:`FanOut` it is then given only the samples of those names (None or absent: all of them).
    # Optional ``name_filters: Mapping[str, Callable[[Metric], bool]]``: of those names, the samples
    # it may read (a test it would make itself anyway, made by the FanOut while the sample is hot).
    # Optional ``drain_rejected() -> list[HandlerFailure]``: samples of its names it read but
    # refused (a wrong type, a value out of range) since the last call, counted and skipped by the
    # handler, dead-lettered by the runtime like a failure's samples (at most
    # MAX_ISOLATED_FAILURES and one summary per batch, kept so by the handler).
    # Optional ``isolation_key(sample) -> Hashable``: the samples it reads as one whole (a hypervisor's
    # round of port and ruleset samples) share a key; after a failure :func:`isolate` hands them back
    # together, not one at a time (alone, a ruleset sample would read as a round without ports).

    def handle(self, metrics: Sequence[Metric], now: float) -> None: ...


# A handler that fails on a batch is given its samples again one at a time (or one unit at a time: see
# ``isolation_key``), so only the samples it cannot handle are dead-lettered (with their record's topic,
# partition and offset) and it still handles the rest. A handler that fails on every sample is not
# retried past this many failures per batch: the rest of its part is dead-lettered in one summary record.
# No more than this many failed samples are dead-lettered one by one either (a failed unit may hold many).
MAX_ISOLATED_FAILURES = 20


@dataclass(slots=True)
class HandlerFailure:
    handler: str
    error: str
    sample: Metric | None = None   # None: no one sample to blame (the batch as a whole, or the rest not retried)
    not_retried: int = 0


class Refusals:
    """The samples a handler refused since the runtime last asked, to dead-letter: at most
    MAX_ISOLATED_FAILURES, the rest in one summary (as the runtime bounds a failing handler's dead
    letters). A sample handed again (the runtime's isolation of a failure) is not counted twice."""

    def __init__(self, handler: str) -> None:
        self.handler = handler
        self._kept: dict[int, HandlerFailure] = {}   # id(sample) -> why
        self._more = 0   # refused beyond MAX_ISOLATED_FAILURES since the last drain

    def add(self, sample: Metric, error: str) -> bool:
        """Keep ``sample`` refused for ``error``; False when it was already (count and log nothing)."""
        if id(sample) in self._kept:
            return False
        if len(self._kept) < MAX_ISOLATED_FAILURES:
            self._kept[id(sample)] = HandlerFailure(self.handler, error, sample)
        else:
            self._more += 1
        return True

    def drain(self) -> list[HandlerFailure]:
        out = list(self._kept.values())
        if self._more:
            out.append(HandlerFailure(self.handler, f"refused {self._more} more samples of this batch, "
                                                    "not dead-lettered one by one", None, self._more))
        self._kept, self._more = {}, 0
        return out


class HandlerFailed(RuntimeError):
    """One or more handlers failed on a batch; ``failures`` names the samples each could not handle."""

    def __init__(self, failures: list[HandlerFailure]) -> None:
        self.failures = failures
        super().__init__("; ".join(dict.fromkeys(f"{f.handler}: {f.error}" for f in failures)))


def isolate(handler: Handler, part: Sequence[Metric], now: float, error: str) -> list[HandlerFailure]:
    """After ``handler`` raised ``error`` on ``part``: hand it the samples again a unit at a time; the failures.

    A unit is one sample, or, for a handler with an ``isolation_key``, the samples of one key, in the
    order of each key's first sample: what the handler reads as one whole, which handed a sample at a
    time it would read as a whole of its own (a hypervisor's ruleset without its ports: every port
    gone, its findings cleared). A poison sample then costs its unit: every sample of a unit that
    fails is a failure. At most MAX_ISOLATED_FAILURES samples are named one by one; past that many
    failed units the rest of the part is not retried; what is neither is counted in one summary.

    The samples it had handled before it raised are handed to it again: handlers are expected to
    treat a sample they have seen (same series, same time) as a repeat, which the stream's
    at-least-once delivery asks of them anyway."""
    name = getattr(handler, "name", type(handler).__name__)
    key_of: Callable[[Metric], Hashable] | None = getattr(handler, "isolation_key", None)
    units: Iterable[list[Metric]] = ([m] for m in part) if key_of is None else _units(part, key_of)
    failures: list[HandlerFailure] = []
    failed_units = 0
    unnamed = 0   # samples of failed units beyond the MAX_ISOLATED_FAILURES named
    done = 0      # samples handed again so far
    for unit in units:
        done += len(unit)
        try:
            handler.handle(unit, now)
        except Exception as e:  # noqa: BLE001 - the samples are dead-lettered with the reason
            failed_units += 1
            why = f"{type(e).__name__}: {e}"
            if len(unit) > 1:
                why += f" (with the {len(unit) - 1} other samples it reads as one unit)"
            for m in unit:
                if len(failures) < MAX_ISOLATED_FAILURES:
                    failures.append(HandlerFailure(name, why, m))
                else:
                    unnamed += 1
            if failed_units >= MAX_ISOLATED_FAILURES and done < len(part):
                break
    rest = len(part) - done
    if unnamed or rest:
        what = f"failed on {len(failures) + unnamed} samples of this batch"
        if unnamed:
            what += f", {unnamed} of them not dead-lettered one by one"
        if rest:
            what += f"; the next {rest} were not retried"
        failures.append(HandlerFailure(name, what, None, unnamed + rest))
    return failures or [HandlerFailure(name, error)]   # no single sample fails: the batch as a whole did


def _units(part: Sequence[Metric], key_of: Callable[[Metric], Hashable]) -> list[list[Metric]]:
    """``part`` by ``key_of``, each unit in batch order, units in the order of their first sample; a
    sample whose key cannot be had (the hook raised, an unhashable key) is a unit of its own."""
    out: list[list[Metric]] = []
    by_key: dict[Hashable, list[Metric]] = {}
    for m in part:
        try:
            key = key_of(m)
            unit = by_key.get(key)
            if unit is None:
                unit = by_key[key] = []
                out.append(unit)
        except Exception:  # noqa: BLE001 - a bug of the hook must not stop the isolation
            out.append([m])
            continue
        unit.append(m)
    return out


class FanOut:
    """Several handlers on one topic's batches, in order: a record is fetched and decoded once.

    A failing handler does not keep the later ones from the batch. It is given its part again one sample
    (or one unit: ``isolation_key``) at a time (:func:`isolate`), and the samples it still fails on are
    raised together afterwards (:class:`HandlerFailed`), so :func:`process_batch` dead-letters those
    samples only, naming the handler.
    """

    def __init__(self, name: str, handlers: Sequence[Handler]) -> None:
        self.name = name
        self.handlers = list(handlers)
        # Each handler's ``names`` (read once, here); None: it reads every sample.
        self._wants: list[frozenset[str] | None] = [getattr(h, "names", None) for h in self.handlers]
        self._filters: list[Mapping[str, Callable[[Metric], bool]]] = [getattr(h, "name_filters", {})
                                                                       for h in self.handlers]
        self._rejected: list[HandlerFailure] = []   # refused samples, for drain_rejected()
        # metric name -> (position, filter or None) of the handlers that read it, built as names appear
        self._routes: dict[str, tuple[tuple[int, Callable[[Metric], bool] | None], ...]] = {}

    def parts(self) -> Parts | None:
        """An empty split of one batch, to fill as it is decoded (None: no handler declares names)."""
        return None if all(w is None for w in self._wants) else Parts(self)

    def split(self, metrics: Sequence[Metric]) -> list[Sequence[Metric]]:
        """Each handler's part of a batch, in batch order: the samples of the names it reads."""
        parts = self.parts()
        if parts is None:
            return [metrics] * len(self.handlers)
        parts.add(metrics)
        return parts.result(metrics)   # raises what a name filter raised

    def _route(self, name: str) -> tuple[tuple[int, Callable[[Metric], bool] | None], ...]:
        route = self._routes.get(name)
        if route is None:
            if len(self._routes) >= 10_000:   # names are free-form: the cache stays bounded
                self._routes.clear()
            route = self._routes[name] = tuple((i, self._filters[i].get(name)) for i, w in enumerate(self._wants)
                                               if w is not None and name in w)
        return route

    def handle(self, metrics: Sequence[Metric], now: float) -> None:
        self.handle_split(self.split(metrics), now)

    def handle_split(self, parts: Sequence[Sequence[Metric]], now: float) -> None:
        """:meth:`handle` with the batch already split (``parts``: one per handler, as :meth:`split`).
        The samples the handlers refused are in :meth:`drain_rejected` afterwards."""
        failures: list[HandlerFailure] = []
        # every handler is called, even with no sample of its names: it still expires its state
        for h, part in zip(self.handlers, parts):
            try:
                h.handle(part, now)
            except Exception as e:  # noqa: BLE001 - isolated, reported below, dead-lettered by process_batch
                health.ERRORS.labels(h.name).inc()
                log.error("handler_failed", agent=h.name, error=f"{type(e).__name__}: {e}", exc_info=True)
                failures += isolate(h, part, now, f"{type(e).__name__}: {e}")
            drain = getattr(h, "drain_rejected", None)
            if drain is not None:
                self._rejected += drain()
        if failures:
            raise HandlerFailed(failures)

    def drain_rejected(self) -> list[HandlerFailure]:
        """The samples the handlers refused since the last call (each with the handler's reason)."""
        out, self._rejected = self._rejected, []
        return out


class Parts:
    """One batch split by :class:`FanOut` per handler, filled as samples come (:meth:`add`, in order).

    One pass for all handlers, instead of every handler walking every sample to pick its own (the
    detectors agent's batch mixes ~30 names, each detector reads one to four). It goes by runs of one
    name (``groupby``, in C): a record's samples come in such runs (a server's 24 sensors, a
    hypervisor's 30 ports), so the Python work is per run, not per sample. Fed record by record
    while decoding, it reads each sample while it is still in the CPU's cache (a batch of 5,000
    records is ~10^5 samples, far more than the cache holds: a later pass waits on memory)."""

    __slots__ = ("_fan", "_parts", "_extends", "_error")

    def __init__(self, fan: FanOut) -> None:
        self._fan = fan
        self._parts: list[list[Metric]] = [[] for _ in fan.handlers]
        self._extends: dict[str, tuple[Callable[[Iterable[Metric]], None], ...]] = {}   # this batch's routes
        # A name filter that raised: kept for result(), where it counts as a handler failure (while
        # decoding it must not stop the batch's decode and dead letters)
        self._error: Exception | None = None

    def add(self, metrics: Iterable[Metric]) -> None:
        if self._error is not None:
            return
        try:
            self._add(metrics)
        except Exception as e:  # noqa: BLE001 - raised again by result()
            self._error = e

    def _add(self, metrics: Iterable[Metric]) -> None:
        extends = self._extends
        for name, run in groupby(metrics, _NAME):
            route = extends.get(name)
            if route is None:
                route = extends[name] = tuple(_extend(self._parts[i], f) for i, f in self._fan._route(name))
            if len(route) == 1:
                route[0](run)
            elif route:
                samples = list(run)
                for extend in route:
                    extend(samples)

    def result(self, metrics: Sequence[Metric]) -> list[Sequence[Metric]]:
        """Each handler's part (``metrics``, the whole batch, for a handler without ``names``)."""
        if self._error is not None:
            raise self._error
        return [metrics if w is None else part for w, part in zip(self._fan._wants, self._parts)]


def _extend(part: list[Metric], only: Callable[[Metric], bool] | None) -> Callable[[Iterable[Metric]], None]:
    if only is None:
        return part.extend
    return lambda samples: part.extend(filter(only, samples))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while one batch is decoded and handled.

    A batch allocates hundreds of thousands of objects that all stay alive until the handlers are
    done (the decoded samples): every first-generation collection in between walks them and
    promotes them, and the older generations' collections then walk them again (measured: about a
    third of the decode time at 2,000 records per batch). Reference counting still frees everything
    acyclic at once; the collector runs again right after the batch, over what survived it. The
    pause covers synchronous code only (no awaits), so it never spans other coroutines' work.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# returns what the topic's send gives: an asyncio future of the delivery is watched (process_batch)
SendDeadLetter = Callable[[DeadLetter], Awaitable[Any]]
Highwater = Callable[[str, int], int | None]


def failure_deadletters(agent: str, failures: Sequence[HandlerFailure],
                        messages: Sequence[RawMessage], verb: str = "failed") -> list[DeadLetter]:
    """One dead letter per failed (``verb`` "rejected": refused) sample, carrying the topic,
    partition, offset and key of the record it came in (found by decoding the batch's records
    again: this runs only when a handler failed or refused a sample)."""
    where: dict[bytes, RawMessage] = {}
    if any(f.sample is not None for f in failures):
        for msg in messages:
            if msg.value is None:
                continue
            for m in parse_record(msg.value if isinstance(msg.value, (bytes, str)) else bytes(msg.value)).metrics:
                where.setdefault(_identity(m), msg)
    out = []
    for f in failures:
        reason = f"handler {agent} {verb}: {f.handler}: {f.error}"
        if f.sample is None:
            out.append(DeadLetter(reason, "", None, None, None, {"handler": f.handler, "samples": f.not_retried},
                                  value_is="summary"))
            continue
        msg = where.get(_identity(f.sample))
        out.append(DeadLetter(reason, msg.topic if msg else "", msg.partition if msg else None,
                              msg.offset if msg else None, msg.key if msg else None, f.sample.to_dict(),
                              _replayed_from(msg) if msg else None, "sample"))
    return out


def _identity(m: Metric) -> bytes:
    return orjson.dumps(m.to_dict(), option=orjson.OPT_SORT_KEYS)


def decode_and_handle(agent: str, messages: Sequence[RawMessage], handler: Handler,
                      max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S) -> DecodedBatch:
    """The synchronous part of :func:`process_batch`: decode, count, handle. A handler failure dead-letters
    the samples that handler cannot handle, each with its record's place and the handler's error (the
    other samples are handled); a failure before any handler ran, every record once. Never raises for
    bad data or a handler bug."""
    # a lone handler runs as a FanOut of one: the same split, isolation and dead letters as the worker's
    fan = handler if isinstance(handler, FanOut) else FanOut(agent, [handler])
    parts = fan.parts()   # split while decoding (None: no handler declares names)
    batch = decode_messages(messages, max_clock_skew_s=max_clock_skew_s,
                            on_samples=None if parts is None else parts.add)
    for topic, (records, _, _) in batch.per_topic.items():
        health.RECORDS_IN.labels(topic).inc(records)
    if not batch.metrics:
        return batch
    now = time.time()
    try:
        if parts is not None:
            fan.handle_split(parts.result(batch.metrics), now)   # a filter's error: as a handler's
        else:
            fan.handle(batch.metrics, now)
    except HandlerFailed as e:
        health.ERRORS.labels(agent).inc()
        log.error("handler_failed", agent=agent, error=str(e)[:300])
        batch.deadletters.extend(failure_deadletters(agent, e.failures, messages))
    except Exception as e:  # noqa: BLE001 - a bug before any handler ran (a name filter): every record, once
        health.ERRORS.labels(agent).inc()
        log.error("handler_failed", agent=agent, error=f"{type(e).__name__}: {e}", exc_info=True)
        batch.deadletters.extend(
            DeadLetter(f"handler {agent} failed: {type(e).__name__}: {e}", msg.topic, msg.partition, msg.offset,
                       msg.key, msg.value, _replayed_from(msg), "record") for msg in messages if msg.value is not None)
        return batch
    rejected = fan.drain_rejected()
    if rejected:
        batch.deadletters.extend(failure_deadletters(agent, rejected, messages, "rejected"))
    now = time.time()
    for topic, (_, samples, newest) in batch.per_topic.items():
        if samples:
            health.SAMPLES_IN.labels(topic).inc(samples)
            health.EVENT_AGE.labels(topic).set(max(0.0, now - newest))
    return batch


async def process_batch(agent: str, messages: Sequence[RawMessage], handler: Handler,
                        send_deadletter: SendDeadLetter, highwater: Highwater | None = None,
                        max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S) -> DecodedBatch:
    """Decode, dead-letter, handle, and account for one batch. Never raises for bad data or a handler bug.

    The returned batch no longer holds the decoded samples (``metrics`` is empty): they are released
    before the garbage collector runs again, which would otherwise walk every one of them once more."""
    t0 = time.perf_counter()
    with gc_paused():
        batch = decode_and_handle(agent, messages, handler, max_clock_skew_s)
        batch.metrics = []
    await send_deadletters(agent, batch.deadletters, send_deadletter)
    if highwater is not None:
        for (topic, partition), offset in batch.offsets.items():
            hw = highwater(topic, partition)
            if hw is not None:
                health.LAG.labels(topic, str(partition)).set(max(0, hw - offset - 1))
    health.BATCH_SIZE.labels(agent).observe(batch.records)
    health.BATCH_SECONDS.labels(agent).observe(time.perf_counter() - t0)
    health.LAST_BATCH.labels(agent).set(time.time())
    return batch


async def send_deadletters(agent: str, deadletters: Iterable[DeadLetter], send_deadletter: SendDeadLetter) -> None:
    """Count, log and send each dead letter; one the producer raises on or the broker refuses later is counted
    lost (``deadletter_send_failed``). Never raises."""
    for dl in deadletters:
        health.DEADLETTERED.labels(dl.topic or health.NO_SOURCE_TOPIC).inc()
        DEADLETTER_LOG.warning(log, "deadlettered", key=agent, agent=agent, source_topic=dl.topic,
                               partition=dl.partition, offset=dl.offset, reason=dl.reason[:300])
        try:
            sent = await send_deadletter(dl)
        except Exception as e:  # noqa: BLE001
            health.ERRORS.labels(agent).inc()
            _deadletter_lost(agent, dl.topic, dl.partition, dl.offset, e)
            continue
        if isinstance(sent, asyncio.Future):
            # Faust's send returns once the record is buffered: a broker refusal or a timeout fails this later
            sent.add_done_callback(partial(_deadletter_delivered, agent, dl.topic, dl.partition, dl.offset))


def _deadletter_delivered(agent: str, topic: str, partition: int | None, offset: int | None,
                          delivery: asyncio.Future[Any]) -> None:
    """A dead letter's delivery ended: lost if it failed or was cancelled (the producer stopped first)."""
    if delivery.cancelled():
        _deadletter_lost(agent, topic, partition, offset, asyncio.CancelledError("delivery cancelled"))
    elif (error := delivery.exception()) is not None:   # also marks it retrieved: no asyncio warning at GC
        _deadletter_lost(agent, topic, partition, offset, error)


def _deadletter_lost(agent: str, topic: str, partition: int | None, offset: int | None, error: BaseException) -> None:
    DEADLETTER_SEND_FAILURES.labels(DEADLETTER_STAGE).inc()
    # a poison topic with a broken dead-letter topic loses one per record: one line a minute per source topic
    DEADLETTER_LOST_LOG.error(log, "deadletter_send_failed", key=f"{agent}:{topic}", agent=agent,
                              source_topic=topic, partition=partition, offset=offset,
                              error=f"{type(error).__name__}: {error}"[:300])
