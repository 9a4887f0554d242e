"""What every detector agent shares: the handler contract and its bookkeeping.

A handler is plain Python (no I/O, no awaits), like the runtime's batch handlers: ``handle(metrics,
now)`` feeds one batch of valid samples to its detectors. On top of that, a *detector* handler
keeps its state per **state key** (a series, a hypervisor, a host ...) so that the agent loop
(:mod:`opsloop.streams.agents.stateful`) can persist exactly the keys a batch changed into a Faust table,
and restore them after a restart or rebalance:

* ``touched()``: the keys changed since the last call (what the loop writes, once per batch);
* ``fed()``: of those, the keys a sample of the batch fed (changed in ``process``): the loop learns from
  them which partition a key's records come from, the one its state must be written to (the other
  touched keys, a finding about another host or a dropped key, may belong to any partition);
* ``state_of(key)``: the JSON-able state of one key (None: delete it);
* ``restore(states)``: replace the in-memory state with what the table holds;
* ``drain_outbox()``: (event, finding) pairs for the findings sink (see ``FindingBook``).

State is bounded: a key not seen for ``state_ttl_s`` (receive time) or, past ``max_state_keys``,
the least recently seen one is dropped (``forget``: its state, its gauge children, and its open
findings cleared, at the event time each was last seen), deleted from the table and counted in
``opsloop_stream_state_dropped_total{handler, reason="ttl"|"cap"}``. A replay guard (the last event
time of a series) never blocks a series when it lies beyond the clock skew: one sample with a
broken clock, or a state restored from one, must not make every later reading look like a replay.

A stored state is checked field by field as it is restored (``restore_key``, the detectors' ``from_dict``
with :mod:`opsloop.streams.detectors.state_check`): a key whose state a handler cannot use (an older
version's, a bug's, a damaged one: a time before 1970, 1e308 for a count, a string for a number, a field
missing) is refused, logged (``state_restore_failed`` naming handler, key and field), counted in
``opsloop_stream_state_dropped_total{reason="unreadable"}``, and starts afresh; the other keys are restored.
Its open findings that can still be read from the refused state (each one whose own fields make a finding
about the key, whatever else is damaged) are cleared at once, at the event time each was last seen, as the
TTL clears a dropped key's: forgotten, no clear was ever published and their pages stayed open for good. The
fresh state opens them again, a new incident, if the condition still holds.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Iterator, Mapping, Sequence

from prometheus_client import Counter

from opsloop.records import Finding
from opsloop.log import Sampled, get_logger
from opsloop.records import Metric
from opsloop.topics import Topic
from opsloop.streams.bounded import STATE_DROPPED, STATE_KEYS, UNREADABLE, Recency, count_dropped, drop_children
from opsloop.streams.detectors.findingbook import FindingBook, where_key
from opsloop.streams.detectors.state_check import StateError
from opsloop.streams.runtime.batch import DEFAULT_MAX_CLOCK_SKEW_S, HandlerFailure, Refusals

__all__ = ["DetectorHandler", "Publication", "drop_children", "log", "number"]

log = get_logger("stream.agents")

REJECTED = Counter("opsloop_detector_samples_rejected_total",
                   "Samples of a detector's metrics it could not read (a wrong type, a value out of "
                   "range): skipped, the series goes on", ["detector"])
# a poison stream of unreadable samples must not flood the log: one line a minute per handler,
# naming how many went unlogged since (the counter carries the rate)
REJECT_LOG_EVERY_S = 60.0

Publication = tuple[str, Finding]   # (event: opened/updated/refreshed/cleared, finding)
# How deep under a stored state's top the books of its findings may lie (keystone: regimes.<source>.book)
STORED_BOOK_DEPTH = 4

def number(fields: Mapping[str, Any], *names: str) -> float | None:
    """The first of ``names`` that is a real number in ``fields`` (bools are not numbers here)."""
    for n in names:
        v = fields.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


class DetectorHandler:
    """Base class: subclasses implement ``process``, ``books``, ``state_of``, ``restore_key``."""

    name: str = "detector"
    topics: tuple[Topic, ...] = ()
    key_label: str = "host"   # the where-label of a finding that names its state key
    # The metric names ``process`` reads (None: it looks at every sample). Under the agent's FanOut
    # the handler is given only those samples, split from the batch once for all handlers.
    names: frozenset[str] | None = None

    def __init__(self) -> None:
        self._touched: set[str] = set()
        self._fed: set[str] = set()   # keys changed by process(): their samples are in the batch
        self._outbox: list[Publication] = []
        self.rejected = 0   # samples of the right name that an adapter could not read
        self._reject_log = Sampled(REJECT_LOG_EVERY_S)
        self._refused = Refusals(self.name)   # until drain_rejected()
        self.max_clock_skew_s = DEFAULT_MAX_CLOCK_SKEW_S
        self._seen: Recency[str] = Recency()   # state keys by receive time they were last touched
        self._now = time.time()

    def bound_state(self, *, max_clock_skew_s: float, state_ttl_s: float, max_state_keys: int) -> None:
        """Apply the stream section's bounds (``stream.max_clock_skew_s``, ``state_ttl_s``, ``max_state_keys``)."""
        self.max_clock_skew_s = max_clock_skew_s
        self._seen.ttl_s, self._seen.cap = state_ttl_s, max_state_keys

    # ---------------------------------------------------------------- the contract (agent loop)
    def handle(self, metrics: Sequence[Metric], now: float) -> None:
        self._now = now
        before, self._touched = self._touched, set()
        try:
            self.process(metrics, now)
        finally:
            # process() changes only the keys of its samples; expiry and the books (a role's drift, a
            # generation's deviation: findings about hosts not in this batch) come after
            self._fed |= self._touched
            self._touched |= before
        self._expire(now)
        for book in self.changed_books():
            self._collect(book)

    def reject(self, event: str, sample: Metric, error: str, **fields: Any) -> None:
        """A sample this handler cannot read (``error`` says why): counted (``rejected``,
        ``REJECTED``), kept for the runtime to dead-letter (:meth:`drain_rejected`), and logged as
        ``event`` at most once every ``REJECT_LOG_EVERY_S`` per handler, with the count unlogged since."""
        if not self._refused.add(sample, error):   # handed again (the runtime's isolation of a failure)
            return
        self.rejected += 1
        REJECTED.labels(self.name).inc()
        self._reject_log.warning(log, event, handler=self.name, error=error, **fields)

    def drain_rejected(self) -> list[HandlerFailure]:
        """The samples refused since the last call, to dead-letter: at most MAX_ISOLATED_FAILURES,
        the rest in one summary (as the runtime bounds a failing handler's dead letters)."""
        return self._refused.drain()

    @staticmethod
    def is_replay(ts: float, last: float | None) -> bool:
        """``ts`` does not advance past ``last``: an at-least-once replay, already counted."""
        return last is not None and ts <= last

    def trusted_time(self, ts: float, what: str) -> float | None:
        """A restored event time, or None when it lies beyond the wall clock plus the allowed skew.

        The stream stage rejects such samples; a state written before it did (or by a worker with a
        broken clock) must not make every later sample of the series look like a replay."""
        limit = time.time() + self.max_clock_skew_s
        if ts <= limit:
            return ts
        log.warning("restored_time_in_future", handler=self.name, what=what, timestamp=ts,
                    ahead_s=round(ts - limit + self.max_clock_skew_s, 1))
        return None

    @property
    def _bounded(self) -> bool:
        """Whether this handler can drop keys (implements ``forget``); others bound themselves."""
        return type(self).forget is not DetectorHandler.forget

    def _expire(self, now: float) -> None:
        if not self._bounded:
            return
        victims = self._seen.expired(now)
        if not victims:
            return
        keys = {k for k, _ in victims}
        reason = "cap" if any(r == "cap" for _, r in victims) else "ttl"
        try:
            self._clear_findings(keys, reason)
            self.forget(keys)
        except Exception as e:  # noqa: BLE001 - a forget bug must not stop the batch
            log.error("state_forget_failed", handler=self.name, keys=len(keys), error=f"{type(e).__name__}: {e}",
                      exc_info=True)
        self._touched |= keys   # state_of(key) is None now: the table entries are deleted
        count_dropped(self.name, victims)
        log.info("state_dropped", handler=self.name, keys=len(keys), reasons=sorted({r for _, r in victims}),
                 kept=len(self._seen))
        STATE_KEYS.labels(self.name).set(len(self._seen))

    def _clear_findings(self, keys: set[str], reason: str) -> None:
        """Clear the open findings of dropped keys (one pass over each book) and collect them now:
        a book may go with its key's state."""
        why = (f"no telemetry for {self._seen.ttl_s:g} s: state dropped" if reason == "ttl"
               else f"state dropped: more than {self._seen.cap} keys")
        for book in list(self.books()):
            for doc in list(book.open.values()):
                if doc["where"].get(self.key_label) in keys:
                    # at the event time it was last seen, not the worker's clock (``now``, ahead of every
                    # event time): a key back a moment later re-opens it after the clear, not before it
                    # (the paging actuator drops a record older than the clear), and a replay clears alike
                    book.clear(doc["detector"], doc["where"], float(doc["last_seen"]), why)
            self._collect(book)

    def touched(self) -> set[str]:
        out, self._touched = self._touched, set()
        return out

    def fed(self) -> set[str]:
        """The keys a sample fed since the last call (a subset of what ``touched`` returns)."""
        out, self._fed = self._fed, set()
        return out

    def drain_outbox(self) -> list[Publication]:
        out, self._outbox = self._outbox, []
        return out

    def open_findings(self) -> list[Finding]:
        return [f for book in self.books() for f in book.open_findings()]

    def restore(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Replace all in-memory state with ``states`` (key -> state_of(key) as stored)."""
        gone = {k for k in self._seen.keys() if k not in states}
        if gone and self._bounded:
            # keys of partitions that went to another worker: their gauge children go too (reset() keeps
            # them), or this worker showed their last values, frozen, beside their new owner's
            try:
                self.forget(gone)
            except Exception as e:  # noqa: BLE001 - a forget bug must not stop the restore
                log.error("state_forget_failed", handler=self.name, keys=len(gone), error=f"{type(e).__name__}: {e}",
                          exc_info=True)
        self.reset()
        self._seen.clear()
        now = time.time()
        for key, state in states.items():
            if self._bounded:
                self._seen.seen(key, now)   # restored keys age from the restore
            try:
                if not isinstance(state, Mapping):   # (the table's codec gives bytes it cannot read so)
                    raise StateError("state", f"expected an object, got {state!r:.200}")
                self.restore_key(key, state)
            except Exception as e:  # noqa: BLE001 - one key's state must not cost the others theirs
                self._refuse(key, e, state)
        self.after_restore()

    def _refuse(self, key: str, error: Exception, state: Any = None) -> None:
        """A key whose stored state cannot be used (written by an older version, by a bug, or damaged):
        logged naming the field, counted (``reason="unreadable"``), and the key starts afresh. Any
        exception, not only the checks' :class:`StateError`: before, one the restore did not expect
        escaped it and failed every batch of the worker, and a value taken unchecked made every later
        sample of the key raise."""
        field = error.field if isinstance(error, StateError) else None
        # still seen as restored: a key that never comes back is dropped by the TTL, its table entry with it
        if self._bounded:
            try:
                self.forget({key})   # whatever of it was restored before the error
            except Exception as e:  # noqa: BLE001 - a forget bug must not stop the restore
                log.error("state_forget_failed", handler=self.name, keys=1, error=f"{type(e).__name__}: {e}")
        try:
            cleared, unreadable = self._clear_refused(key, state)
        except Exception as e:  # noqa: BLE001 - a salvage bug must not stop the restore
            log.error("state_salvage_failed", handler=self.name, key=key, error=f"{type(e).__name__}: {e}"[:500])
            cleared, unreadable = 0, None
        log.error("state_restore_failed", handler=self.name, key=key, field=field,
                  error=f"{type(error).__name__}: {error}"[:500], findings_cleared=cleared,
                  findings_unreadable=unreadable)
        STATE_DROPPED.labels(self.name, UNREADABLE).inc()

    def _clear_refused(self, key: str, state: Any) -> tuple[int, int | None]:
        """Clear the open findings a refused ``state`` of ``key`` still holds readable (into the outbox, for the
        agent to publish); (how many, how many open entries could not be read: None when the state is no object,
        its findings not even countable). An entry is taken when its own fields make a finding a book holds
        (``FindingBook.from_dict``'s checks) about ``key``: the clear carries its id, its ``first_seen`` (the
        paging book applies a clear of the incident it holds whatever else) and its ``last_seen``, as
        ``_clear_findings`` does. One still open in a live book (restored by another key) is left to it."""
        if not isinstance(state, Mapping):
            return 0, None
        salvage, unreadable = FindingBook(), 0
        for doc in self.stored_books(state):
            entries = doc.get("open") if isinstance(doc, Mapping) else None
            if entries is None:
                continue
            if not isinstance(entries, Mapping):
                unreadable += 1   # an "open" that is no object: at least one finding lost
                continue
            for entry in entries.values():
                found = self._readable_finding(key, entry)
                if found is None:
                    unreadable += 1
                else:
                    salvage.open.setdefault(*found)
        live = [b.open for b in self.books()] if salvage.open else []
        why = (f"the detector's stored state of {key!r:.200} was unreadable at its restore: refused, the key is "
               f"re-evaluated from fresh samples (a new finding opens if the condition still holds)")
        for wk, doc in list(salvage.open.items()):
            if not any(wk in book for book in live):
                salvage.clear(doc["detector"], doc["where"], float(doc["last_seen"]), why)
        cleared = salvage.drain()
        self._outbox.extend(cleared)
        return len(cleared), unreadable

    def _readable_finding(self, key: str, entry: Any) -> tuple[str, dict[str, Any]] | None:
        """(its book key, the entry as a book keeps it) when ``entry`` is an open finding about ``key``; else None."""
        try:
            finding = Finding.model_validate(entry)
            wk = where_key(finding.detector, finding.where)   # its own, whatever key the damaged book gave it
            checked = FindingBook.from_dict({"open": {wk: entry}}).open[wk]
            if self.key_of_finding(finding) != key:
                return None   # about another key: clearing it would close a finding its own key holds
        except Exception:  # noqa: BLE001 - a damaged entry is counted, never raised
            return None
        return wk, checked

    def stored_books(self, state: Mapping[str, Any]) -> Iterator[Any]:
        """The stored books (``FindingBook.to_dict``) a state of this handler holds, as far as its shape can be
        read: every member named ``book``, down to ``STORED_BOOK_DEPTH`` objects deep (where every detector
        here keeps its own). A handler storing its findings otherwise overrides it."""
        level: list[Mapping[str, Any]] = [state]
        for _ in range(STORED_BOOK_DEPTH):
            deeper: list[Mapping[str, Any]] = []
            for doc in level:
                for name, value in doc.items():
                    if name == "book":
                        yield value
                    elif isinstance(value, Mapping):
                        deeper.append(value)
            level = deeper

    # ---------------------------------------------------------------------- for subclasses
    def process(self, metrics: Sequence[Metric], now: float) -> None:
        raise NotImplementedError

    def books(self) -> Iterable[FindingBook]:
        raise NotImplementedError

    def changed_books(self) -> Iterable[FindingBook]:
        """The books the last ``process`` call may have changed (default: all); a handler with a book
        per series returns those of the series it touched, so a batch costs what it touched."""
        return self.books()

    def key_of_finding(self, finding: Finding) -> str | None:
        return finding.where.get(self.key_label)

    def state_of(self, key: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def restore_key(self, key: str, state: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def after_restore(self) -> None:
        """Hook: refresh derived gauges once every key is back."""

    def forget(self, keys: set[str]) -> None:
        """Drop all state of ``keys`` and their gauge children (their open findings are cleared already).

        Afterwards ``state_of(key)`` must return None, so the table entries are deleted."""
        raise NotImplementedError

    def _collect(self, book: FindingBook) -> None:
        for event, finding in book.drain():
            self._outbox.append((event, finding))
            key = self.key_of_finding(finding)
            if key is not None:
                self._touched.add(key)

    def touch(self, key: str) -> None:
        self._touched.add(key)
        if self._bounded:
            self._seen.seen(key, self._now)
