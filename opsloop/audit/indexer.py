"""Index audit records into Elasticsearch without ever blocking or failing an actuator.

``submit`` only appends to a bounded in-memory buffer; a background thread (or an explicit
``flush``) sends the buffer with the official client's ``helpers.streaming_bulk``:

* every document is a ``create`` with the record's content id, so a record re-sent after a
  failure that happened *after* Elasticsearch stored it comes back 409 and is counted as a
  duplicate, not stored twice;
* per-document 429/502/503/504 are retried by ``streaming_bulk`` (``max_retries``, exponential
  back-off); a whole request that fails (Elasticsearch down, timeout) puts the batch back at the
  head of the buffer and the thread backs off exponentially (``initial_backoff_s`` doubling up to
  ``max_backoff_s``) before the next try, so an outage costs no CPU and no log storm;
* a document Elasticsearch refuses (400, a mapping error: a bug, retrying cannot help) is counted and
  logged with its id and, up to ``DEAD_LETTER_BYTES``, the record's JSON (the journal is its dead letter), and
  dropped; any other refusal (401 for the request, 403 per document: the API
  key expired or lost its privileges) is not the record's fault and keeps the batch like an outage;
* a request refused as too large (413: a proxy's or the cluster's ``http.max_content_length`` below a
  batch) is not an outage — the same batch would be refused for ever: the batch goes back and later
  requests carry half as many records, down to one; a single record refused as too large is
  rejected like a 400 (counted, logged with its id, dropped). The limit grows back (doubling to
  ``batch_size``) with each request that goes through;
* after ``close()`` a record submitted is dropped at once and counted in
  ``opsloop_audit_dropped_total`` (nothing would ever send it), with a warning a minute at most;
* when the buffer is full the **oldest** record is dropped and ``opsloop_audit_dropped_total``
  counts it: the newest actions are the ones an on-call engineer asks about. Memory is bounded by
  ``max_buffered`` records plus one batch in flight.

The index template (``templates/audit.json``) is installed before the first bulk request and
again after every failed one (Elasticsearch may have come back empty). A cluster may also restart empty
*between* two requests (the audit trail is idle for minutes at a time): the next bulk would then
auto-create the stream as a plain index with dynamic mapping, for good. So a bulk request sent more than
``template_check_s`` (5 s) after the last check first checks that the template is still there (one HEAD
request, at most one per 5 s, none while idle) and installs it again if not. That covers every restart:
one that no request of ours saw fail happened wholly between two requests, so the gap before the next
one is longer than the restart itself, which takes a node longer than 5 s.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from elastic_transport import TransportError
from elasticsearch import ApiError, Elasticsearch, helpers
from prometheus_client import Counter, Gauge

from opsloop.records import AuditRecord
from opsloop.audit.templates import AUDIT_TEMPLATE, DEFAULT_STREAM, install_template
from opsloop.es_client import ElasticsearchSettings
from opsloop.log import Sampled, get_logger

log = get_logger("audit.indexer")

RETRYABLE_STATUS = (429, 502, 503, 504)
# The only per-document answer that drops a record: Elasticsearch refused the document itself (mapping or
# parsing error). 401/403/404 say the API key or the cluster is wrong, not the record: kept and retried.
REJECTED_STATUS = 400
TOO_LARGE_STATUS = 413   # the request, not its records: sent again in smaller requests
# the template is checked again before a bulk this long after the last check: below any node's restart time
TEMPLATE_CHECK_S = 5.0
# A rejected record is dropped: its JSON goes into the rejection's log line (the journal is its dead letter),
# up to this size: a log line stays under Docker's 16 KiB split and journald's 48 KiB LineMax, whole JSON.
DEAD_LETTER_BYTES = 12 * 1024

RECORDS = Counter("opsloop_audit_records_total", "Audit records handled by the Elasticsearch indexer, by outcome "
                  "(indexed, duplicate: already stored, rejected: refused by Elasticsearch)", ["stream", "outcome"])
DROPPED = Counter("opsloop_audit_dropped_total", "Audit records dropped because the in-memory buffer was full "
                  "(Elasticsearch unreachable for too long; the oldest go first) or submitted after close", ["stream"])
BUFFERED = Gauge("opsloop_audit_buffered_records", "Audit records waiting to be indexed", ["stream"])
BULK_FAILURES = Counter("opsloop_audit_bulk_failures_total", "Bulk requests that failed as a whole (Elasticsearch "
                        "unreachable or erroring) or left records to retry (429, 503, 403 for a document); the "
                        "records are kept and retried with back-off", ["stream"])


@dataclass(frozen=True, slots=True)
class FlushResult:
    indexed: int = 0
    duplicates: int = 0
    rejected: int = 0
    remaining: int = 0
    error: str | None = None   # why the batch was put back (None: everything sent was answered)

    @property
    def ok(self) -> bool:
        return self.error is None


class ElasticsearchIndexer:
    """A sink for :class:`~opsloop.audit.trail.AuditLog`: buffered, bulk, retried, bounded."""

    def __init__(self, client: Elasticsearch, stream: str = DEFAULT_STREAM, max_buffered: int = 10_000,
                 batch_size: int = 500, bulk_retries: int = 3, initial_backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, flush_interval_s: float = 1.0,
                 template_check_s: float = TEMPLATE_CHECK_S, clock: Callable[[], float] = time.monotonic) -> None:
        if max_buffered < 1 or batch_size < 1:
            raise ValueError(f"max_buffered and batch_size must be >= 1 (got {max_buffered}, {batch_size})")
        if not stream.startswith(DEFAULT_STREAM):
            raise ValueError(f"stream {stream!r} must start with {DEFAULT_STREAM!r} (the index template's pattern)")
        self.client = client
        self.stream = stream
        self.max_buffered = max_buffered
        self.batch_size = batch_size
        self.bulk_retries = bulk_retries
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.flush_interval_s = flush_interval_s
        self.template_check_s = template_check_s
        self.clock = clock
        self._buffer: deque[AuditRecord] = deque()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()   # one bulk request at a time (thread and explicit flush)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._template_ok = False
        self._in_flight: list[AuditRecord] = []
        self._template_checked = 0.0   # clock() of the last install or check that went through
        self._limit = batch_size      # records per request: halved by a 413, grown back by successes
        self._split = False           # the last flush halved the limit: flush_all goes on at once
        self._closed = False
        self._after_close = Sampled(60.0)
        self.backoff_s = initial_backoff_s
        BUFFERED.labels(stream).set(0)

    # ------------------------------------------------------------------------------ the sink API
    def submit(self, record: AuditRecord) -> None:
        """Queue one record (never blocks on Elasticsearch, never raises for an outage)."""
        if self._closed:
            DROPPED.labels(self.stream).inc()
            self._after_close.warning(log, "audit_record_after_close", stream=self.stream, id=record.id,
                                      action="dropped: the indexer is closed, nothing would send it")
            return
        with self._lock:
            self._append_bounded([record], at_head=False)
        self._wake.set()

    @property
    def buffered(self) -> int:
        """Records not yet confirmed by Elasticsearch: queued plus the batch in flight."""
        with self._lock:
            return len(self._buffer) + len(self._in_flight)

    def pending_ids(self) -> list[str]:
        """Ids of the records not yet confirmed (in flight first, then queued)."""
        with self._lock:
            return [r.id for r in (*self._in_flight, *self._buffer)]

    # ------------------------------------------------------------------------------ sending
    def flush(self) -> FlushResult:
        """Send one batch (at most ``batch_size`` records) now; see the module docstring for outcomes."""
        with self._flush_lock:
            with self._lock:
                batch = [self._buffer.popleft() for _ in range(min(self._limit, len(self._buffer)))]
                self._in_flight = batch
            if not batch:
                return FlushResult()
            pending = {r.id: r for r in batch}
            indexed = duplicates = rejected = 0
            error: str | None = None
            self._split = False
            try:
                if not self._template_ok or self.clock() - self._template_checked >= self.template_check_s:
                    self._ensure_template()
                for ok, item in helpers.streaming_bulk(
                        self.client, self._actions(batch), chunk_size=len(batch),
                        max_retries=self.bulk_retries, initial_backoff=self.initial_backoff_s,
                        max_backoff=self.max_backoff_s, retry_on_status=RETRYABLE_STATUS,
                        # a whole request refused (401, 413, 503 ...) raises: the helper would otherwise
                        # report it per document with that status and a 401 would drop the batch
                        raise_on_error=False, raise_on_exception=True):
                    info: dict[str, Any] = next(iter(item.values()))
                    rid, status = info.get("_id"), int(info.get("status") or 0)
                    if ok:
                        indexed += 1
                    elif status == 409:
                        duplicates += 1
                    elif status == REJECTED_STATUS:
                        rejected += 1
                        self._rejected(pending.get(str(rid)), rid, status, _reason(info))
                    else:
                        error = f"Elasticsearch answered {status} for a document: {_reason(info)}"
                        continue   # stays pending: back at the head of the buffer
                    pending.pop(str(rid), None)
                self._limit = min(self.batch_size, self._limit * 2)
            except ApiError as e:
                if getattr(e.meta, "status", None) == TOO_LARGE_STATUS:
                    rejected += self._too_large(batch, pending)
                else:   # refused as a whole (401, 503 ...), or the template call failed: keep the batch
                    error = f"{type(e).__name__}: {e}"
                    self._template_ok = False
            except TransportError as e:
                # Unreachable or timed out: keep the batch.
                error = f"{type(e).__name__}: {e}"
                self._template_ok = False
            except Exception as e:  # noqa: BLE001 - an answer the client cannot read: kept like an outage,
                # or the thread died and every later record stayed buffered, silently
                error = f"{type(e).__name__}: {e}"[:500]
                self._template_ok = False
                log.error("audit_index_unexpected", stream=self.stream, error=error, exc_info=True)
            finally:
                with self._lock:
                    self._in_flight = []
                    self._append_bounded([r for r in batch if r.id in pending], at_head=True)
                for outcome, n in (("indexed", indexed), ("duplicate", duplicates), ("rejected", rejected)):
                    if n:
                        RECORDS.labels(self.stream, outcome).inc(n)
            if error is not None:
                BULK_FAILURES.labels(self.stream).inc()
            return FlushResult(indexed, duplicates, rejected, self.buffered, error)

    def flush_all(self) -> FlushResult:
        """Flush batch after batch until the buffer is empty or a batch fails."""
        total = FlushResult()
        while True:
            r = self.flush()
            total = FlushResult(total.indexed + r.indexed, total.duplicates + r.duplicates,
                                total.rejected + r.rejected, r.remaining, r.error)
            if not r.ok or r.remaining == 0 or ((r.indexed + r.duplicates + r.rejected) == 0 and not self._split):
                return total

    # ------------------------------------------------------------------------------ background
    def start(self) -> "ElasticsearchIndexer":
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"audit-indexer:{self.stream}", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout_s: float = 10.0) -> FlushResult:
        """Stop the thread and try once to send what is left (records still buffered are reported); records
        submitted after this are dropped and counted."""
        self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        result = self.flush_all()
        if result.remaining:
            log.warning("audit_records_unsent", stream=self.stream, remaining=result.remaining, error=result.error)
        return result

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            if not self.buffered:
                continue
            result = self.flush_all()
            if result.ok:
                self.backoff_s = self.initial_backoff_s
                continue
            log.warning("audit_index_failed", stream=self.stream, buffered=result.remaining, error=result.error,
                        retry_in_s=round(self.backoff_s, 2))
            self._stop.wait(self.backoff_s)   # interruptible by close()
            self.backoff_s = min(self.backoff_s * 2, self.max_backoff_s)

    # ------------------------------------------------------------------------------ internals
    def _ensure_template(self) -> None:
        """Install the index template, or, once installed, check it is still there and install it again
        if the cluster lost it (module docstring). Raises like a bulk request: the caller keeps the batch."""
        started = self.clock()
        if self._template_ok and not self.client.indices.exists_index_template(name=AUDIT_TEMPLATE):
            self._template_ok = False
            log.warning("audit_template_missing", stream=self.stream, template=AUDIT_TEMPLATE,
                        action="installed again before the next bulk request (the cluster restarted empty?)")
        if not self._template_ok:
            install_template(self.client, AUDIT_TEMPLATE)
            self._template_ok = True
        self._template_checked = started

    def _too_large(self, batch: list[AuditRecord], pending: dict[str, AuditRecord]) -> int:
        """A 413 for ``batch``: halve the records per request (the batch stays pending), or, for a batch
        of one, reject that record (nothing smaller can be sent). How many were rejected."""
        if len(batch) > 1:
            self._limit = max(1, len(batch) // 2)
            self._split = True
            log.warning("audit_request_too_large", stream=self.stream, records=len(batch), next_records=self._limit)
            return 0
        rid = batch[0].id
        pending.pop(rid, None)
        self._rejected(batch[0], rid, TOO_LARGE_STATUS, "too large for a request on its own")
        return 1

    def _rejected(self, record: AuditRecord | None, rid: Any, status: int, reason: str) -> None:
        """Log a dropped record with its content (bounded): what the actuator did stays readable in the logs."""
        dead_letter: dict[str, Any] = {}
        if record is not None:
            raw = record.encode()
            if len(raw) <= DEAD_LETTER_BYTES:
                dead_letter["record"] = raw.decode()
            else:   # the fields an on-call engineer asks about; before/after do not fit a log line
                dead_letter.update(record_bytes=len(raw), actor=record.actor, action=record.action,
                                   target=record.target, version=record.version, mode=record.mode.value,
                                   result=record.result, time=record.timestamp)
        log.error("audit_record_rejected", stream=self.stream, id=rid, status=status, reason=reason, **dead_letter)

    def _actions(self, batch: list[AuditRecord]) -> Iterator[dict[str, Any]]:
        for r in batch:
            yield {"_op_type": "create", "_index": self.stream, "_id": r.id, "_source": r.document()}

    def _append_bounded(self, records: list[AuditRecord], at_head: bool) -> None:
        """Add records (caller holds the lock); drop the oldest beyond ``max_buffered`` and count them."""
        if at_head:
            self._buffer.extendleft(reversed(records))
        else:
            self._buffer.extend(records)
        overflow = len(self._buffer) - self.max_buffered
        if overflow > 0:
            for _ in range(overflow):
                self._buffer.popleft()
            DROPPED.labels(self.stream).inc(overflow)
        BUFFERED.labels(self.stream).set(len(self._buffer) + len(self._in_flight))


def _reason(info: dict[str, Any]) -> str:
    err = info.get("error")
    if isinstance(err, dict):
        return f"{err.get('type')}: {err.get('reason')}"
    return str(err)[:300]


def client_for(es: ElasticsearchSettings | str, request_timeout_s: float | None = None) -> Elasticsearch:
    """A client for the indexer (hosts, API key or basic auth, CA from the settings; a URL string means one
    host without auth): no client-side retries (the indexer's back-off does that)."""
    settings = es if isinstance(es, ElasticsearchSettings) else ElasticsearchSettings(hosts=[es])
    timeout = settings.request_timeout_s if request_timeout_s is None else request_timeout_s
    return settings.client(request_timeout=timeout, max_retries=0, retry_on_timeout=False)
