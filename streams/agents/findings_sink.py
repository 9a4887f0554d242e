"""Where findings go: the ``findings`` topic (keyed by finding id) and Prometheus.

Kafka: one record per lifecycle event of a finding (opened, updated, refreshed, cleared; see
``FindingBook``), value ``Finding.encode()``, key the finding id (so a compacted topic keeps the
latest state of every finding), headers ``event`` and ``detector``.

Prometheus (the worker's /metrics):

* ``opsloop_finding_active{detector, severity, id, <where labels>}`` 1 while open, 0 once cleared
  (kept ``cleared_retention_s`` so that dashboards and alert rules see the resolve, then dropped);
* ``opsloop_finding_score{...}`` the finding's score in [0, 1];
* ``opsloop_findings_total{detector, severity, event}`` counter of published events.

The where labels differ per detector (hypervisor/port/vm, host/generation, ...), so the gauges are
exported by a custom collector whose samples carry each finding's own label set: an alert rule can
then say *which* VM port is open without parsing an id.

**Delivery: at-least-once within a running worker, in order per finding id.** Faust's ``topic.send``
only appends to the producer and returns the delivery future; a finding the broker never acknowledged
used to be lost unseen, and a send that raised was counted and never retried while the detector state
had moved on (a lost ``cleared`` kept its page open for good). Now every event goes through an outbox:

* ``publish`` appends the batch's events, then sends what can go and awaits the delivery futures of
  all of them together, bounded by ``stream.findings_delivery_timeout_s`` for the whole call (the send
  calls included: aiokafka's ``send`` itself waits while the topic's metadata or buffer space is
  missing). An event whose send raised, whose delivery failed or did not complete in time stays in the
  outbox (``opsloop_findings_send_errors_total`` counts each such attempt; one error line per event).
* **Order per id**: only the oldest waiting event of an id is ever in flight; the next one of that id is
  sent once it is acknowledged (a second *wave* within the same call and deadline; in practice an id
  has one event per batch, so one round-trip per call). So a ``cleared`` never reaches the topic ahead
  of the ``opened`` it follows, and a re-send never lands after a newer event. Other ids go on.
* **Retry**: the outbox is sent again first at every ``publish`` and every
  ``stream.findings_retry_interval_s`` by :class:`FindingsRetry` (a service started with the app, for
  when no batch comes). An attempt still in flight is looked at again (and waited for beside the
  call's own sends, never alone: an outage must not cost every batch the whole timeout), not sent a
  second time: a second copy would queue behind it in the same producer partition and change nothing
  but the duplicates (Faust's producer resolves every delivery by its request timeout,
  ``producer_request_timeout``). A failed one is sent again (``opsloop_findings_send_retries_total``).
  An event may therefore reach the topic more than once (a late acknowledgement after a re-send):
  consumers already take findings at-least-once.
* **Bounded**: past ``stream.findings_outbox_max`` events the oldest are dropped (counted in
  ``opsloop_findings_dropped_total``, one error line each naming detector and id: as rare as the
  publications themselves, which are logged one line each anyway). The oldest event of an id is the one
  a newer event of it supersedes; a lone dropped ``cleared`` is the one to repair by hand.
  ``opsloop_findings_outbox_events`` is the outbox's size.
* ``ActiveFindings`` and ``opsloop_findings_total`` follow ``publish`` at once, once per event, whether
  or not the broker has it yet.

**Kept across a stop or a crash**: the outbox's events are the worker's own decided facts (they stay
through a rebalance), and their batches' offsets may be committed (the state moved on), so a restart does
not publish them again: lost, a ``cleared`` kept its page open for good. So whenever events are still
waiting after a call's bounded wait (a batch's, a retry round's), the outbox is saved to
``<stream.data_dir>/findings-outbox.json`` (``OUTBOX_FILE``; ``opsloop.atomic_file.replace_file``: whole or
not at all, 0600, fsync'ed); rewritten only when its events changed since, removed once it drains. Normal
operation (every event acknowledged within the wait) writes nothing. A crash during a call's wait replays
that batch (its offsets are not committed before its findings are sent). At start the sink loads the file
and sends its events first, oldest first (per id in order), ahead of anything new; the cap applies to them
(log ``findings_outbox_restored``; ``findings_unsent_at_stop`` says where they were saved). Format: an
object ``{"format": "opsloop.findings-outbox", "version": 1, "saved_at": <s>, "events": [{"event": <kind>,
"finding": <the record's value, Finding.encode()>}, ...]}``. A file that cannot be read as a whole (torn,
damaged, another format or version) is logged (``findings_outbox_unreadable``, naming the file and what was
wrong), counted and moved aside (``<file>.corrupt-<unix time>``, the newest three kept): the worker starts
with an empty outbox; an event that no longer parses (or stamped at a time no finding has: before 1970,
after 9999) is skipped and counted, the others kept (``opsloop_findings_outbox_file_errors_total{reason}``).
Restored events skip ``ActiveFindings`` and ``opsloop_findings_total`` (the run that published them did
both; :meth:`FindingsSink.restore` shows what the detector state holds open). One whose id's partition went
to another worker is still sent: the paging book ignores a record older than what it applied for the id
(``controllers/paging/book.py``). Each worker needs
its own ``stream.data_dir`` (docs/operations.md), so the file has a single writer.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import re
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Iterator, cast

import orjson
from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.metrics_core import Metric as PromMetric

from opsloop.atomic_file import replace_file
from opsloop.config import StreamSettings
from opsloop.records import Finding
from opsloop.labels import shorten
from opsloop.log import Sampled, get_logger
from opsloop.streams.agents.base import Publication
from opsloop.streams.detectors.findingbook import CLEARED, OPENED, REFRESHED, UPDATED
from opsloop.streams.detectors.state_check import event_time
from opsloop.streams.runtime.periodic import PeriodicService

log = get_logger("stream.findings")

FINDINGS_TOTAL = Counter("opsloop_findings_total", "Finding lifecycle events published to the findings topic",
                         ["detector", "severity", "event"])
SEND_ERRORS = Counter("opsloop_findings_send_errors_total",
                      "Finding sends that raised, failed or were not acknowledged in time (kept, sent again)",
                      ["detector"])
RETRIES = Counter("opsloop_findings_send_retries_total",
                  "Finding events sent again after a failed or unacknowledged send", ["detector"])
DROPPED = Counter("opsloop_findings_dropped_total",
                  "Finding events dropped unsent: the outbox was full (stream.findings_outbox_max)", ["detector"])
OUTBOX = Gauge("opsloop_findings_outbox_events", "Finding events waiting for Kafka to acknowledge them")
OUTBOX_FILE_ERRORS = Counter("opsloop_findings_outbox_file_errors_total",
                             "Trouble with the saved findings outbox: a file unreadable (moved aside), an event in it "
                             "that no longer parses (skipped), a save or removal that failed", ["reason"])

_DEFAULTS = StreamSettings()   # one source of the defaults: the stream section's
DELIVERY_TIMEOUT_S = _DEFAULTS.findings_delivery_timeout_s
MAX_OUTBOX = _DEFAULTS.findings_outbox_max
RETRY_INTERVAL_S = _DEFAULTS.findings_retry_interval_s
# an outage fails every retry of every waiting event: one line a minute per detector (the counter counts each)
RETRY_FAILED_LOG = Sampled(60.0)
# a full or read-only disk fails every save of an outage: one line a minute (the counter counts each)
SAVE_FAILED_LOG = Sampled(60.0)

OUTBOX_FILE = "findings-outbox.json"   # in stream.data_dir (module docstring)
OUTBOX_FORMAT = "opsloop.findings-outbox"
OUTBOX_VERSION = 1
KINDS = frozenset({OPENED, UPDATED, REFRESHED, CLEARED})
MAX_SKIPPED_LOGGED = 5   # skipped events named in the log line (all counted)
# unreadable outbox files set aside and kept for a look: the newest few (a disk that tears the file at every
# start must not fill the data directory with copies)
KEEP_SET_ASIDE = 3

_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")
_RESERVED = frozenset({"detector", "severity", "id", "job", "instance", "__name__"})


def finding_labels(f: Finding) -> dict[str, str]:
    """Prometheus labels of a finding: detector, severity, id and its where labels (sanitised)."""
    labels = {"detector": f.detector, "severity": f.severity.value, "id": f.id}
    for k, v in sorted(f.where.items()):
        name = _LABEL_NAME.sub("_", k)
        if not name or name[0].isdigit() or name.startswith("__"):
            name = "where_" + name.lstrip("_")
        if name in _RESERVED:
            name = "where_" + name
        # the paging actuator's bound and shortening: its page inhibits this finding's backstop (equal labels)
        labels.setdefault(name, shorten(str(v)))
    return labels


@dataclass(slots=True)
class _Entry:
    labels: dict[str, str]
    active: bool
    score: float
    cleared_at: float | None = None   # wall clock, for the retention of the 0 sample


class ActiveFindings:
    """The custom collector behind ``opsloop_finding_active`` and ``opsloop_finding_score``."""

    def __init__(self, cleared_retention_s: float = 600.0) -> None:
        self.cleared_retention_s = cleared_retention_s
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()   # /metrics is served from another thread

    def update(self, finding: Finding) -> None:
        with self._lock:
            if finding.cleared:
                prev = self._entries.get(finding.id)
                labels = prev.labels if prev else finding_labels(finding)
                self._entries[finding.id] = _Entry(labels, False, 0.0, time.time())
            else:
                self._entries[finding.id] = _Entry(finding_labels(finding), True, finding.score)

    def only_open(self, finding_ids: set[str]) -> int:
        """Drop the entries shown open that are not in ``finding_ids`` (cleared ones stay their retention);
        how many went."""
        with self._lock:
            gone = [k for k, e in self._entries.items() if e.active and k not in finding_ids]
            for k in gone:
                del self._entries[k]
        return len(gone)

    def get(self, finding_id: str) -> _Entry | None:
        with self._lock:
            return self._entries.get(finding_id)

    def collect(self) -> Iterator[PromMetric]:
        now = time.time()
        active = PromMetric("opsloop_finding_active", "1 while a finding is open, 0 for a while after it cleared",
                            "gauge")
        score = PromMetric("opsloop_finding_score", "Score in [0, 1] of an open finding", "gauge")
        with self._lock:
            for fid in [k for k, e in self._entries.items()
                        if e.cleared_at is not None and now - e.cleared_at > self.cleared_retention_s]:
                del self._entries[fid]
            for e in self._entries.values():
                active.add_sample("opsloop_finding_active", e.labels, 1.0 if e.active else 0.0)
                score.add_sample("opsloop_finding_score", e.labels, e.score)
        yield active
        yield score

    def describe(self) -> list[PromMetric]:
        return []   # samples vary; avoid calling collect() at registration time


ACTIVE = ActiveFindings()
REGISTRY.register(ACTIVE)

Send = Callable[[bytes, bytes, list[tuple[str, bytes]]], Awaitable[object]]
"""``send(key, value, headers)``: hands one record to the producer and returns its delivery, an awaitable
(Faust's ``topic.send`` result, resolved when the broker acknowledges, failed if it never does), or
anything else to say it is delivered already."""


@dataclass(slots=True, eq=False)
class _Pending:
    """One finding event in the outbox, until the broker acknowledges it (or the cap drops it)."""

    seq: int                      # publication order: the outbox's age order
    event: str
    finding: Finding
    fid: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    delivery: asyncio.Future[Any] | None = None   # the last attempt, while it may still succeed
    attempts: int = 0
    late: bool = False            # the last attempt ran out of time once already (counted once)
    restored: bool = False        # loaded from the outbox file: left unsent by an earlier run


class OutboxFileError(ValueError):
    """The outbox file as a whole is not one (empty, torn, not JSON, another format or version)."""


def _dump_outbox(entries: Iterable[_Pending]) -> bytes:
    """The outbox file's bytes: each event with its record's value as sent (``Finding.encode()``), oldest first."""
    return orjson.dumps({"format": OUTBOX_FORMAT, "version": OUTBOX_VERSION, "saved_at": time.time(),
                         "events": [{"event": e.event, "finding": orjson.Fragment(e.value)} for e in entries]})


def _parse_event(item: Any) -> tuple[str, Finding]:
    if not isinstance(item, dict):
        raise ValueError(f"not an object but {type(item).__name__}")
    event = item.get("event")
    if event not in KINDS:
        raise ValueError(f"event {event!r} is not one of {sorted(KINDS)}")
    doc = item.get("finding")
    if not isinstance(doc, dict):
        raise ValueError(f"finding: not an object but {type(doc).__name__}")
    finding = Finding.decode(orjson.dumps(doc))   # the topic's own decoding: schema version, fields
    # ... and times a detector can have stamped: a finite -1e13 decoded, and went to the topic, whose
    # consumers could not write it as a time (the paging actuator's alert)
    event_time(finding.first_seen, "finding.first_seen")
    event_time(finding.last_seen, "finding.last_seen")
    return event, finding


def parse_outbox(data: bytes) -> tuple[list[tuple[str, Finding]], list[str]]:
    """The events of an outbox file, oldest first, and why each one that no longer parses was skipped;
    :class:`OutboxFileError` when the file as a whole is not an outbox file."""
    if not data:
        raise OutboxFileError("empty file")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise OutboxFileError(f"not JSON: torn or damaged ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != OUTBOX_FORMAT:
        raise OutboxFileError(f"not a findings outbox (no \"format\": \"{OUTBOX_FORMAT}\")")
    if doc.get("version") != OUTBOX_VERSION:
        raise OutboxFileError(f"version {doc.get('version')!r} unknown (this worker reads {OUTBOX_VERSION})")
    items = doc.get("events")
    if not isinstance(items, list):
        raise OutboxFileError(f"events: not a list but {type(items).__name__}")
    events: list[tuple[str, Finding]] = []
    skipped: list[str] = []
    for i, item in enumerate(items):
        try:
            events.append(_parse_event(item))
        except (ValueError, TypeError) as e:   # RecordError is a ValueError naming field and value
            skipped.append(f"events[{i}]: {e}")
    return events, skipped


def _prune_set_aside(path: Path) -> None:
    """Remove all but the newest ``KEEP_SET_ASIDE`` copies of ``path`` set aside as unreadable (by the time in
    their name); a copy that cannot be removed is logged and left."""
    prefix = f"{path.name}.corrupt-"

    def set_aside_at(p: Path) -> float:
        try:
            return float(p.name[len(prefix):])
        except ValueError:
            return math.inf   # not named by us: never the oldest, never removed
    try:
        copies = sorted((p for p in path.parent.iterdir() if p.name.startswith(prefix)), key=set_aside_at)
    except OSError as e:
        log.warning("findings_outbox_set_aside_not_pruned", path=str(path), error=f"{type(e).__name__}: {e}")
        return
    for old in [p for p in copies if set_aside_at(p) != math.inf][:-KEEP_SET_ASIDE]:
        try:
            old.unlink()
        except OSError as e:
            log.warning("findings_outbox_set_aside_not_pruned", path=str(old), error=f"{type(e).__name__}: {e}")


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Look at an abandoned delivery's outcome, so asyncio does not log it as never retrieved."""
    if not fut.cancelled():
        fut.exception()


def _failure(fut: asyncio.Future[Any]) -> BaseException | None:
    if fut.cancelled():
        return asyncio.CancelledError("delivery cancelled")
    return fut.exception()


class FindingsSink:
    """Publishes findings through ``send(key, value, headers)`` and keeps the gauges in step; events not
    acknowledged wait in an outbox and are sent again, in order per finding id, saved to ``outbox_path``
    while they wait and loaded from it first at start (module docstring)."""

    def __init__(self, send: Send | None, active: ActiveFindings = ACTIVE, *,
                 delivery_timeout_s: float = DELIVERY_TIMEOUT_S, max_outbox: int = MAX_OUTBOX,
                 outbox_path: Path | None = None) -> None:
        self.send = send
        self.active = active
        self.delivery_timeout_s = delivery_timeout_s
        self.max_outbox = max_outbox
        self.outbox_path = outbox_path   # None: memory only
        self._queues: dict[str, deque[_Pending]] = {}               # finding id -> its events, oldest first
        self._by_age: OrderedDict[int, _Pending] = OrderedDict()    # every waiting event, oldest first
        self._seq = 0
        self._lock = asyncio.Lock()   # one flush at a time: the agent's and the retry service's
        self.dropped = 0
        self.restored = 0   # events loaded from the outbox file at start
        # The outbox's events change (added, removed) -> _version; the file holds _version's events when
        # _on_disk == _version, none when None, something else when -1 (to rewrite or remove).
        self._version = 0
        self._on_disk: int | None = None
        if outbox_path is not None and send is not None:   # without a producer the file waits for one
            self._load(outbox_path)
        OUTBOX.set(len(self._by_age))   # the worker's one sink: the gauge is its outbox from the start

    @property
    def pending(self) -> int:
        """Events in the outbox (not yet acknowledged)."""
        return len(self._by_age)

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def bound_delivery(self, *, delivery_timeout_s: float, max_outbox: int) -> None:
        """Apply the stream section's bounds (``stream.findings_delivery_timeout_s``, ``findings_outbox_max``);
        the cap at once: the restored events are loaded before it is known."""
        self.delivery_timeout_s, self.max_outbox = delivery_timeout_s, max_outbox
        if len(self._by_age) > max_outbox:
            self._cap()
            OUTBOX.set(len(self._by_age))
            self._persist()

    async def publish(self, publications: Iterable[Publication]) -> int:
        """Show, count and log every publication, then send the outbox (older events first) and wait for
        the broker's acknowledgements, at most ``delivery_timeout_s``. Never raises; returns how many events
        the broker acknowledged during the call, the outbox's included."""
        for event, finding in publications:
            self.active.update(finding)
            FINDINGS_TOTAL.labels(finding.detector, finding.severity.value, event).inc()
            log.info("finding", kind=event, detector=finding.detector, id=finding.id,
                     severity=finding.severity.value, where=finding.where, observed=finding.observed)
            if self.send is not None:
                self._enqueue(event, finding)
        return await self.retry()

    async def retry(self) -> int:
        """Send the outbox now (the retry service's call; ``publish`` ends with it). Never raises."""
        if self.send is None:
            return 0
        if not self._by_age:
            self._persist()   # a file left to remove (a failed removal, only skipped events restored)
            return 0
        delivered = 0
        try:
            delivered = await self._flush(self.send)
        except Exception as e:  # noqa: BLE001 - a bug here must not stop the detectors; the events stay
            log.error("findings_flush_failed", pending=len(self._by_age), error=f"{type(e).__name__}: {e}",
                      exc_info=True)
        finally:
            self._cap()
            OUTBOX.set(len(self._by_age))
            self._persist()   # after the bounded wait: what is still waiting survives a stop or a crash
        return delivered

    def _persist(self) -> None:
        """Bring the outbox file in step: written when events wait and changed since the last save, removed
        when none wait. Nothing to do in the normal case (no file, nothing waiting). Never raises."""
        path = self.outbox_path
        if path is None or (self._on_disk == self._version if self._by_age else self._on_disk is None):
            return
        try:
            if self._by_age:
                path.parent.mkdir(parents=True, exist_ok=True)
                replace_file(path, _dump_outbox(self._by_age.values()))
                self._on_disk = self._version
            else:
                # no directory fsync: a removal lost to a power cut re-sends delivered events (at-least-once)
                path.unlink(missing_ok=True)
                self._on_disk = None
        except OSError as e:   # the events stay in memory and are sent all the same; saved at the next call
            OUTBOX_FILE_ERRORS.labels("write").inc()
            SAVE_FAILED_LOG.warning(log, "findings_outbox_save_failed", key="save", path=str(path),
                                    events=len(self._by_age), error=f"{type(e).__name__}: {e}")

    def _load(self, path: Path) -> None:
        """Put the events of the outbox file left by an earlier run first in the (empty) outbox. Never raises:
        a file that cannot be read as a whole is moved aside, an event that no longer parses skipped."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as e:
            self._set_aside(path, f"cannot read: {type(e).__name__}: {e}")
            return
        try:
            events, skipped = parse_outbox(data)
        except OutboxFileError as e:
            self._set_aside(path, str(e))
            return
        for event, finding in events:   # first in the outbox, oldest first: per id in publication order
            self._enqueue(event, finding, restored=True)
        self.restored = len(self._by_age)
        # the file holds exactly the outbox, or (events skipped) something to rewrite or remove
        self._on_disk = self._version if not skipped and self._by_age else -1
        if skipped:
            OUTBOX_FILE_ERRORS.labels("event").inc(len(skipped))
            log.error("findings_outbox_events_skipped", path=str(path), skipped=len(skipped), kept=self.restored,
                      errors=skipped[:MAX_SKIPPED_LOGGED])
        if self._by_age:
            log.warning("findings_outbox_restored", path=str(path), events=self.restored, **self._summary())
        self._cap()   # (the gauge is set by the constructor, after the load)

    def _set_aside(self, path: Path, why: str) -> None:
        """Move an unreadable outbox file out of the way (kept for a look), so that the next start does not
        trip over it again, and say so."""
        OUTBOX_FILE_ERRORS.labels("unreadable").inc()
        aside = path.with_name(f"{path.name}.corrupt-{time.time():.3f}")
        try:
            os.replace(path, aside)
        except OSError as e:
            log.error("findings_outbox_unreadable", path=str(path), error=why, moved_to=None,
                      move_error=f"{type(e).__name__}: {e}", events_lost="unknown: starting with an empty outbox")
            return
        log.error("findings_outbox_unreadable", path=str(path), error=why, moved_to=str(aside),
                  events_lost="unknown: starting with an empty outbox")
        _prune_set_aside(path)

    def _summary(self) -> dict[str, Any]:
        """What the outbox holds, for a log line (not empty)."""
        by_detector: dict[str, int] = {}
        for e in self._by_age.values():
            by_detector[e.finding.detector] = by_detector.get(e.finding.detector, 0) + 1
        return {"findings": len(self._queues), "by_detector": by_detector,
                "oldest_id": next(iter(self._by_age.values())).fid}

    def _enqueue(self, event: str, finding: Finding, restored: bool = False) -> None:
        fid = finding.id
        try:
            value = finding.encode()
        except Exception as e:  # noqa: BLE001 - would fail again: counted and logged, not kept
            SEND_ERRORS.labels(finding.detector).inc()
            log.error("finding_send_failed", detector=finding.detector, id=fid, kind=event,
                      error=f"{type(e).__name__}: {e}")
            return
        self._seq += 1
        entry = _Pending(self._seq, event, finding, fid, fid.encode(), value,
                         [("event", event.encode()), ("detector", finding.detector.encode())], restored=restored)
        self._queues.setdefault(fid, deque()).append(entry)
        self._by_age[entry.seq] = entry
        self._version += 1

    async def _flush(self, send: Send) -> int:
        """Waves of the oldest waiting event of each id: sent (or, in flight already, looked at again), their
        deliveries awaited together; an id whose event got through has its next one in the next wave. One
        deadline for the whole call. An id whose event failed or is still in flight waits for the next call."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.delivery_timeout_s
            held: set[str] = set()   # ids done for this call
            delivered = 0
            while True:
                wave = sorted((q[0] for fid, q in self._queues.items() if fid not in held), key=lambda e: e.seq)
                if not wave:
                    return delivered
                waiting: list[_Pending] = []
                fresh = False   # an attempt made by this wave: worth waiting for
                for entry in wave:
                    if entry.delivery is not None and not entry.delivery.done():
                        waiting.append(entry)     # in flight since an earlier call: looked at, not sent twice
                    elif entry.delivery is not None and _failure(entry.delivery) is None:
                        delivered += self._delivered(entry)   # acknowledged since the last look
                    elif loop.time() >= deadline:
                        held.add(entry.fid)       # no time left this call
                    elif await self._send(send, entry, deadline):
                        if entry.delivery is None:
                            delivered += self._delivered(entry)   # a send that says delivered at once
                        else:
                            waiting.append(entry)
                            fresh = True
                    else:
                        held.add(entry.fid)
                if fresh:
                    # Earlier calls' attempts still in flight are not waited for alone: during an outage
                    # every batch would wait the whole timeout for them, with nothing new to send.
                    await asyncio.wait([e.delivery for e in waiting if e.delivery is not None],
                                       timeout=max(0.0, deadline - loop.time()))
                for entry in waiting:
                    fut = cast(asyncio.Future[Any], entry.delivery)   # set: an entry waits on its delivery
                    if not fut.done():
                        if not entry.late:
                            entry.late = True
                            self._failed(entry, TimeoutError(
                                f"not acknowledged within {self.delivery_timeout_s} s (awaited again)"))
                        held.add(entry.fid)
                    elif (error := _failure(fut)) is None:
                        delivered += self._delivered(entry)
                    else:
                        self._failed(entry, error)
                        held.add(entry.fid)

    async def _send(self, send: Send, entry: _Pending, deadline: float) -> bool:
        """One attempt: False if ``send`` raised or did not return by ``deadline`` (nothing handed over)."""
        f = entry.finding
        if entry.attempts or entry.restored:   # a restored event: left unacknowledged by an earlier run
            RETRIES.labels(f.detector).inc()
        entry.attempts += 1
        entry.delivery, entry.late = None, False
        limit = asyncio.timeout_at(deadline)
        try:
            async with limit:
                result = await send(entry.key, entry.value, entry.headers)
        except Exception as e:  # noqa: BLE001 - a broker hiccup must not stop the detectors
            if limit.expired():   # ours: aiokafka's send waits for metadata and buffer space
                e = TimeoutError(f"send did not return within {self.delivery_timeout_s} s")
            self._failed(entry, e)
            return False
        if inspect.isawaitable(result):
            fut = asyncio.ensure_future(result)
            fut.add_done_callback(_retrieve)
            entry.delivery = fut
        return True

    def _delivered(self, entry: _Pending) -> int:
        self._remove(entry)
        if entry.attempts > 1 or entry.late or entry.restored:
            log.info("finding_sent_after_retry", detector=entry.finding.detector, id=entry.fid, kind=entry.event,
                     attempts=entry.attempts, restored=entry.restored)
        return 1

    def _failed(self, entry: _Pending, error: BaseException) -> None:
        f = entry.finding
        SEND_ERRORS.labels(f.detector).inc()
        text = f"{type(error).__name__}: {error}"
        if entry.attempts <= 1 and not entry.restored:   # one error line per event; retries (and restored) sampled
            log.error("finding_send_failed", detector=f.detector, id=entry.fid, kind=entry.event, error=text,
                      outbox=len(self._by_age))
        else:
            RETRY_FAILED_LOG.warning(log, "finding_send_retry_failed", key=f.detector, detector=f.detector,
                                     id=entry.fid, kind=entry.event, attempts=entry.attempts, error=text,
                                     outbox=len(self._by_age))

    def _remove(self, entry: _Pending) -> None:
        q = self._queues[entry.fid]
        if q[0] is entry:
            q.popleft()   # always, by construction: only an id's oldest event is sent, and the oldest overall
        else:             # is the oldest of its id; never raise from here (publish must not)
            q.remove(entry)
        if not q:
            del self._queues[entry.fid]
        del self._by_age[entry.seq]
        self._version += 1

    def _cap(self) -> None:
        """Drop the oldest events beyond ``max_outbox`` (the oldest overall is the oldest of its id)."""
        while len(self._by_age) > self.max_outbox:
            _, entry = next(iter(self._by_age.items()))
            self._remove(entry)
            self.dropped += 1
            f = entry.finding
            DROPPED.labels(f.detector).inc()
            log.error("finding_dropped", detector=f.detector, id=entry.fid, kind=entry.event,
                      severity=f.severity.value, where=f.where, attempts=entry.attempts,
                      findings_outbox_max=self.max_outbox)

    def log_unsent(self) -> int:
        """Save and log the events still waiting (the worker is stopping): with an outbox file the next start
        sends them first (a warning), without one, or its save failing, they are lost (an error); how many."""
        n = len(self._by_age)
        if n:
            self._persist()
            saved = self.outbox_path is not None and self._on_disk == self._version
            fields = {"events": n, **self._summary(), "saved": saved,
                      "path": str(self.outbox_path) if self.outbox_path is not None else None}
            if saved:
                log.warning("findings_unsent_at_stop", **fields)
            else:
                log.error("findings_unsent_at_stop", **fields)
        return n

    def restore(self, open_findings: Iterable[Finding]) -> None:
        """Show the findings recovered from detector state as active (nothing is re-published): these and
        no others, of every handler at once. One shown open but not recovered belongs to a partition that
        went to another worker, which shows it now (and clears it): left here, it stayed 1 for good. The
        outbox (its events loaded from the file included) is not touched: it is what the topic still lacks."""
        restored = [f for f in open_findings if not f.cleared]
        gone = self.active.only_open({f.id for f in restored})
        if gone:
            log.info("findings_handed_over", findings=gone)
        for f in restored:
            self.active.update(f)


class FindingsRetry(PeriodicService):
    """Sends the sink's outbox every ``interval_s`` when no batch does (a quiet topic after an outage),
    and saves and logs what is left unsent when the worker stops. Started with the app (``app.add_dependency``)."""

    def __init__(self, sink: FindingsSink, interval_s: float = RETRY_INTERVAL_S, **kwargs: Any) -> None:
        self.sink = sink
        super().__init__(interval_s, **kwargs)

    async def once(self) -> None:
        if self.sink.pending and not self.sink.busy:   # busy: a batch is sending it right now
            await self.sink.retry()

    async def on_stop(self) -> None:
        self.sink.log_unsent()
