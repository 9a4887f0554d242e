"""Which alerts are open, by finding id: open, re-send while active, resolve when cleared.

Pure state, no I/O (the service posts and persists). Rules:

* An open finding at or above ``min_severity`` opens one alert (action ``open``), due at once.
* Re-publishing the same finding (same id) refreshes the stored annotations (``refresh``) and is
  never a new page: the alert is re-sent on the re-send schedule with the same labels, which
  Alertmanager treats as the same alert.
* A severity change changes the labels, so the old alert is resolved and the new one opened
  (``severity_changed``); dropping below ``min_severity`` resolves it.
* ``cleared`` resolves (``resolve``): endsAt = now, kept until delivered. A clear for an id we do
  not know (restart without state) is still sent once: Alertmanager drops a resolve for an alert
  that never notified, so this is safe and closes pages left over from before the restart.
* Queued resolves are bounded (``max_pending_resolves``): while Alertmanager is down, or while a new
  group replays the topic from its start, every clear queues one. Over the bound the oldest
  best-effort resolve (an id never open here, or an alert never delivered) is dropped first; a
  resolve of an alert we paged is dropped (oldest first) only when none is left: that alert then
  ends in Alertmanager by itself at its endsAt (``alert_ttl_s`` after its last re-send), which for
  the oldest has passed or is nearest. ``on_drop`` is told of each drop (the service counts and
  logs them).
* Records arrive at least once, and a replay after a crash (or a stale copy) can bring an older record
  after newer ones: a record whose ``last_seen`` is older than the newest applied for its id is ignored
  (``ignore``, "stale"; at a tie, one of an older incident, ``first_seen``, is the older), as is any
  record of an incident (id and ``first_seen``) already cleared, a duplicate clear included. A clear of
  the current incident always applies; of two paging records of one instant the higher severity
  stands, whatever their order. The newest record of ids not open here is remembered for the
  ``MAX_CLOSED`` ids closed last, and the ``first_seen`` of the last ``MAX_CLEARED_PER_ID`` incidents
  cleared per id (a newer one open or not): an incident never comes back after its clear, so its records
  are stale whatever their stamps (``last_seen`` orders the incidents of an id only while the producer's
  clock does not step back, and an actuator's clear said again after a restart carries a new one).
* Incidents of an id are told apart by ``first_seen``, not by the clear's ``last_seen``: a record of an
  incident that started after the one cleared last (``first_seen`` later) is of a new incident and applies
  whatever the clear's ``last_seen`` (two detector workers after a rebalance, or a clock stepped back, stamp
  the clear after the new incident's records; before, the new incident was ignored until its ``last_seen``
  passed the clear's, and never paged when it cleared sooner). A clear of an incident that started before
  the open one is that older incident's: it is marked cleared and ignored, the newer incident's page stays.
  A record of the cleared incident itself (its ``first_seen``) stays stale.
* A finding stamped more than ``MAX_CLOCK_SKEW_S`` ahead of ``now`` is refused (ValueError): it would be
  the newest of its id for good and hide every later record. But for the clear of the open incident (its id
  and ``first_seen``), applied with its ``last_seen`` clamped to ``now``: another worker's clock ahead must not
  leave the page open for good (before, it was refused and the page stuck).
* Every record applied that changes the book (a page, a close, a cleared mark, an ignored older incident's
  clear included) counts in ``changes``: the service saves the book before it commits that record's offset.
  Before, an ignored record's marks were not saved: a crash after the commit lost them, and a late record of
  the closed incident paged it again.
* An alert Alertmanager refuses (400/422, see ``mapping``) is replaced, never dropped: :meth:`PagingBook.rejected`
  gives the fallback to post in its place (``OpsloopPageRejected``, ``mapping.fallback_labels``). An open
  alert refused is marked (``OpenAlert.rejected``, in the state file): it is re-sent, and resolved, as its
  fallback until it resolves or its labels change (then the new labels are tried as they are). A refused
  resolve is replaced by the fallback's resolve (the same fallback labels: they derive from the refused
  labels and the finding id alone, so this holds across a restart that lost the mark). The fallback of an alert
  refused for its size (``TOO_LARGE``: a proxy's 413 to it alone) has its texts cut to ``MAX_SHORT_ANNOTATION``
  characters: a copy of the long ones was refused too, and the page lost.
* A page whose fallback is refused too is lost (:meth:`PagingBook.lost`): it is tried again at the re-send
  interval and counts as lost once (``OpenAlert.lost_at``, in the state file) until it is delivered (then
  :meth:`PagingBook.delivered` reports it late) or cleared; the resolve of such a page, refused too, does not
  count again (``PendingResolve.page_lost``). Before, every re-send counted the same page again.
  :meth:`PagingBook.lost_pages` counts the open alerts lost right now (the service's gauge).
* A resolve delivered is kept (:class:`SentResolve`, in the state file) and re-sent with its own endsAt at the
  re-send interval until ``resend_resolved_s`` past it, as Prometheus does (``resolvedRetention``): an
  Alertmanager that took it and restarted (alerts are not persisted) or a cluster peer that never got it still
  sends the resolve notification its notification log owes. Before, it was sent once: lost that way, the
  receiver's incident (PagerDuty's) stayed open for good. Only resolves of alerts delivered from here (not
  best-effort ones), the labels delivered (a fallback's when it replaced the alert), at most
  ``max_pending_resolves`` (the oldest go first, not counted: each was delivered once); a re-send never ends
  after now (a clock stepped back: an endsAt ahead would re-open the alert). An alert of the same labels open
  again replaces it: never resolved by a late re-send.
* Re-sends are due ``resend_interval_s`` after the last send, on the wall clock; one last sent "after" now (our
  clock stepped back since) is due at once. Before, they waited for the time lost: the open alerts expired.
* Until the service has caught up with the findings (``held_only``: a restart, Kafka away at start) only what
  Alertmanager holds is sent: alerts delivered whose endsAt (last send, before the restart too, + ``alert_ttl_s``)
  has not passed, and the resolves of alerts delivered; before, nothing was, and the open pages expired there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from opsloop.records import Finding, Severity
from opsloop.validation import is_time

from opsloop.controllers.paging.mapping import (MAX_REJECTION_REASON, SEVERITY_RANK, Links, annotations_for,
                                                fallback_annotations, fallback_labels, is_fallback, labels_for,
                                                postable)

STATE_VERSION = 1
DEFAULT_MAX_PENDING_RESOLVES = 10_000
MAX_CLOSED = 10_000        # ids not open whose newest record is kept (about 60 bytes each in the state file)
MAX_CLEARED_PER_ID = 4     # incidents cleared last per id (a replay or a re-sent clear reaches a few back at most)
MAX_CLOCK_SKEW_S = 300.0   # stream.max_clock_skew_s: samples further ahead never made it into a finding
DEFAULT_RESEND_RESOLVED_S = 900.0   # prometheus/notifier's resolvedRetention
TOO_LARGE = "HTTP 413"     # how the client's reason starts for an alert a proxy refused alone for its size
MAX_SHORT_ANNOTATION = 256  # each annotation of that alert's fallback: a copy of its long ones was refused too

LabelKey = tuple[str, tuple[tuple[str, str], ...]]   # finding id and sorted labels: one alert in Alertmanager


@dataclass(slots=True)
class Action:
    kind: str            # open | refresh | severity_changed | resolve | ignore
    finding_id: str
    labels: dict[str, str]
    detail: str = ""


@dataclass(slots=True)
class OpenAlert:
    finding_id: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    event_time: float                 # the finding's last_seen when it opened (for page latency)
    last_sent: float | None = None    # last successful delivery
    delivered_once: bool = False
    first_seen: float = 0.0           # of the newest record applied: which incident (stale records are ignored)
    last_seen: float = 0.0
    rejected: str = ""                # why Alertmanager refused it: its fallback is sent instead (book docstring)
    lost_at: float | None = None      # since when it and its fallback are refused (counted lost once): until delivered
    lost_tries: int = 0               # posts of it refused since then (it is tried again at the re-send interval)

    def outgoing(self, annotations: dict[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
        """The labels and annotations (its own unless given) sent for this alert: the fallback's once refused."""
        annotations = self.annotations if annotations is None else annotations
        if not self.rejected:
            return self.labels, annotations
        return (fallback_labels(self.labels, self.finding_id),
                _fallback_annotations(self.labels, annotations, self.finding_id, self.rejected))


@dataclass(slots=True)
class PendingResolve:
    finding_id: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float
    best_effort: bool = False   # the alert was never delivered from here (not open here, or cleared unsent)
    page_lost: bool = False     # it ends a page counted lost: lost too, it does not count a second time


@dataclass(slots=True)
class SentResolve(PendingResolve):
    """A resolve delivered, re-sent until ``resend_resolved_s`` past its endsAt (book docstring)."""
    last_sent: float | None = None   # None: re-sent at once (restored from the state file)


@dataclass(slots=True)
class Outgoing:
    """One alert of a post and the book's own record it is sent for: firing (an :class:`OpenAlert`) or a
    resolve (a :class:`PendingResolve`), so a refusal or a delivery is told apart without reading the alert."""
    alert: dict[str, Any]
    record: OpenAlert | PendingResolve

    @property
    def resolve(self) -> bool:
        return isinstance(self.record, PendingResolve)


@dataclass(frozen=True, slots=True)
class Late:
    """An open alert delivered after it had been lost: since when, and how many posts of it were refused."""
    alert: OpenAlert
    lost_at: float
    tries: int


class Delivered(NamedTuple):
    first: list[OpenAlert]   # paged for the first time
    resolved: int            # resolves sent
    late: list[Late]         # delivered after being lost (first time or not)


@dataclass
class PagingBook:
    min_severity: Severity = Severity.WARNING
    resend_interval_s: float = 60.0
    alert_ttl_s: float = 240.0
    links: Links = field(default_factory=Links)
    max_pending_resolves: int = DEFAULT_MAX_PENDING_RESOLVES
    on_drop: Callable[[PendingResolve], None] | None = field(default=None, repr=False, compare=False)
    open: dict[str, OpenAlert] = field(default_factory=dict)
    resolves: dict[str, list[PendingResolve]] = field(default_factory=dict)
    # Ids not open here: (first_seen, last_seen, cleared) of the newest record applied, oldest first.
    closed: dict[str, tuple[float, float, bool]] = field(default_factory=dict)
    # Ids with incidents cleared: first_seen of the last ``MAX_CLEARED_PER_ID`` each, the id cleared last last.
    cleared: dict[str, tuple[float, ...]] = field(default_factory=dict)
    resend_resolved_s: float = DEFAULT_RESEND_RESOLVED_S
    # Resolves delivered, re-sent for resend_resolved_s past their endsAt, oldest first.
    resolved: dict[LabelKey, SentResolve] = field(default_factory=dict)
    # Ids with a best-effort resolve queued, oldest first: the cap finds its victim without a scan.
    _best_effort: dict[str, None] = field(default_factory=dict, init=False, repr=False, compare=False)
    _queued: int = field(default=0, init=False, repr=False, compare=False)
    # The last send before the restart of open alerts restored and not sent since (held_only: still in Alertmanager?)
    _restored_sent: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    # Records applied that changed the book: the service saves it before committing their offsets.
    changes: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_pending_resolves < 1:
            raise ValueError(f"max_pending_resolves must be at least 1, not {self.max_pending_resolves}")
        if not 0 <= self.resend_resolved_s < math.inf:
            raise ValueError(f"resend_resolved_s must be finite and at least 0, not {self.resend_resolved_s}")

    # -- findings in ----------------------------------------------------------------------
    def check(self, finding: Finding, now: float) -> Finding:
        """The finding to apply: ValueError for one stamped further ahead of ``now`` than ``MAX_CLOCK_SKEW_S``, but
        for the clear of the open incident (same ``first_seen``), returned with its ``last_seen`` clamped to now."""
        ahead = max(finding.first_seen, finding.last_seen) - now
        if ahead <= MAX_CLOCK_SKEW_S:
            return finding
        current = self.open.get(finding.id)
        if finding.cleared and current is not None and finding.first_seen == current.first_seen:
            # its owner's clock ahead: the page must not stick; clamped, it hides no later record
            return finding.model_copy(update={"last_seen": min(finding.last_seen, now)})
        raise ValueError(f"finding {finding.id}: stamped {ahead:.0f}s in the future "
                         f"(first_seen {finding.first_seen}, last_seen {finding.last_seen}; "
                         f"more than {MAX_CLOCK_SKEW_S:.0f}s ahead)")

    def apply(self, finding: Finding, now: float) -> list[Action]:
        finding = self.check(finding, now)
        fid = finding.id
        current = self.open.get(fid)
        stale = self._stale(finding, current)
        # a late clear of an incident older than the open one: ignored, but that incident is marked cleared
        older_clear = (bool(stale) and finding.cleared and current is not None
                       and finding.first_seen < current.first_seen)
        if stale and not older_clear:
            return [Action("ignore", fid, labels_for(finding), stale)]
        # every record past here changes the book (a mark, a close, a page): saved before its offset is committed
        self.changes += 1
        if stale:
            self._mark_cleared(fid, finding.first_seen)   # that incident is over: its late records stay stale
            return [Action("ignore", fid, labels_for(finding), stale)]
        pages = SEVERITY_RANK[finding.severity] >= SEVERITY_RANK[self.min_severity]
        if finding.cleared or not pages:
            why = "finding cleared" if finding.cleared else f"severity {finding.severity.value} below paging threshold"
            self._close(fid, finding)
            if finding.cleared:
                self._mark_cleared(fid, finding.first_seen)
            if current is not None:
                self._resolve(current, now, finding)
                return [Action("resolve", fid, current.labels, why)]
            if finding.cleared and pages:
                labels = labels_for(finding)
                self._queue_resolve(PendingResolve(fid, labels, annotations_for(finding, self.links),
                                                   finding.first_seen, now, best_effort=True))
                return [Action("resolve", fid, labels, "finding cleared (not open here: resolve sent anyway)")]
            return [Action("ignore", fid, labels_for(finding), why)]
        labels = labels_for(finding)
        annotations = annotations_for(finding, self.links)
        self.resolved.pop(_key(fid, labels), None)   # open again: a late re-send of its resolve must not end it
        if current is None:
            self.closed.pop(fid, None)
            self.open[fid] = OpenAlert(fid, labels, annotations, finding.first_seen, finding.last_seen,
                                       first_seen=finding.first_seen, last_seen=finding.last_seen)
            return [Action("open", fid, labels, annotations["summary"])]
        if current.labels != labels:
            self._resolve(current, now, finding)
            self.open[fid] = OpenAlert(fid, labels, annotations, finding.first_seen, finding.last_seen,
                                       first_seen=finding.first_seen, last_seen=finding.last_seen)
            return [Action("severity_changed", fid, labels,
                           f"{current.labels.get('severity')} -> {labels['severity']}")]
        current.annotations = annotations
        current.first_seen, current.last_seen = finding.first_seen, finding.last_seen
        return [Action("refresh", fid, labels)]

    def _stale(self, finding: Finding, current: OpenAlert | None) -> str:
        """Why ``finding`` is older than the newest record applied for its id ("" when it is not)."""
        if finding.first_seen in self.cleared.get(finding.id, ()) and (
                current is None or finding.first_seen != current.first_seen):   # (the open one: the rules below)
            # whatever its last_seen: a clock stepped back, or a clear said again, must not resolve (or re-open)
            # the page of another incident
            return "stale: its incident is already cleared"
        if current is not None:
            first, last, cleared = current.first_seen, current.last_seen, False
            if finding.cleared and finding.first_seen < first:
                # an older incident's clear, late (another worker's): the open incident started after it
                return (f"stale: the clear of an older incident (first_seen {finding.first_seen}) than the one open "
                        f"(first_seen {first})")
        elif finding.id in self.closed:
            first, last, cleared = self.closed[finding.id]
            if cleared and finding.first_seen > first:
                # started after the incident cleared last: a new incident, whatever that clear's last_seen
                return ""
        else:
            return ""
        if finding.first_seen == first:
            if cleared:
                return "stale: its incident is already cleared"
            if finding.cleared:
                return ""   # the current incident's clear, whatever its last_seen: a page never sticks
        # an older incident's records end before the next one starts: at a tie they are the older
        if finding.last_seen < last or (finding.last_seen == last and finding.first_seen < first):
            return f"stale: older than the record applied (last_seen {finding.last_seen}, applied {last})"
        rank = SEVERITY_RANK[finding.severity]
        if current is not None and (finding.first_seen, finding.last_seen) == (first, last) \
                and SEVERITY_RANK[self.min_severity] <= rank < _rank(current.labels.get("severity")):
            # two paging records of one instant: the higher severity stands whatever their order (a
            # replay of both flipped the page down and back up: a resolve and a second page); one below
            # the paging threshold still resolves it
            return f"stale: same instant as the record applied, lower severity ({finding.severity.value})"
        return ""

    def _close(self, fid: str, finding: Finding) -> None:
        self.closed.pop(fid, None)   # re-inserted: now the newest
        self.closed[fid] = (finding.first_seen, finding.last_seen, finding.cleared)
        while len(self.closed) > MAX_CLOSED:
            del self.closed[next(iter(self.closed))]

    def _mark_cleared(self, fid: str, first_seen: float) -> None:
        marks = self.cleared.pop(fid, ())   # re-inserted: now the newest
        self.cleared[fid] = (*(m for m in marks if m != first_seen), first_seen)[-MAX_CLEARED_PER_ID:]
        while len(self.cleared) > MAX_CLOSED:
            del self.cleared[next(iter(self.cleared))]

    def _resolve(self, alert: OpenAlert, now: float, finding: Finding) -> None:
        del self.open[alert.finding_id]
        self._restored_sent.pop(alert.finding_id, None)
        annotations = dict(alert.annotations)
        if finding.cleared and finding.explanation:
            annotations["explanation"] = finding.explanation
        labels, annotations = alert.outgoing(annotations)   # a refused alert: Alertmanager holds its fallback
        # Never delivered (opened and cleared during a catch-up replay, or while Alertmanager was down):
        # Alertmanager would drop this resolve as it would one for an id never open here.
        self._queue_resolve(PendingResolve(alert.finding_id, labels, annotations, alert.starts_at, now,
                                           best_effort=not alert.delivered_once, page_lost=alert.lost_at is not None))

    def _queue_resolve(self, r: PendingResolve) -> None:
        fid = r.finding_id
        self.resolved.pop(_key(fid, r.labels), None)   # this newer resolve of the same alert replaces it
        queue = self.resolves.setdefault(fid, [])
        before = len(queue)
        queue[:] = [q for q in queue if q.labels != r.labels] + [r]
        self._queued += len(queue) - before
        self._best_effort.pop(fid, None)   # re-queued: now the newest
        if any(q.best_effort for q in queue):
            self._best_effort[fid] = None
        while self._queued > self.max_pending_resolves:
            self._drop_one()

    def _drop_one(self) -> None:
        """Drop the oldest best-effort resolve(s) of one id, else the oldest resolve of all."""
        if self._best_effort:
            fid = next(iter(self._best_effort))
            del self._best_effort[fid]
            queue = self.resolves[fid]
            dropped = [q for q in queue if q.best_effort]
            queue[:] = [q for q in queue if not q.best_effort]
        else:
            fid = next(iter(self.resolves))
            queue = self.resolves[fid]
            dropped = queue[:1]
            del queue[:1]
        if not queue:
            del self.resolves[fid]
        self._queued -= len(dropped)
        for r in dropped:
            if self.on_drop is not None:
                self.on_drop(r)

    def pending_resolves(self) -> int:
        return self._queued

    # -- alerts out -----------------------------------------------------------------------
    def due(self, now: float) -> list[dict[str, Any]]:
        """The ``POST /api/v2/alerts`` body of everything to (re-)send now."""
        return [o.alert for o in self.outgoing(now)]

    def outgoing(self, now: float, held_only: bool = False) -> list[Outgoing]:
        """What :meth:`due` posts, each alert with the record it is sent for (resolves first). ``held_only``: only
        what keeps Alertmanager as it was before a restart (:meth:`held`, the resolves of alerts delivered)."""
        out = [Outgoing(postable(r.labels, r.annotations, r.starts_at, r.ends_at), r)
               for queue in self.resolves.values() for r in queue if not (held_only and r.best_effort)]
        self._expire_resolved(now)
        for s in self._resends_due(now):
            ends = min(s.ends_at, now)   # a clock stepped back: an endsAt ahead would re-open the alert
            out.append(Outgoing(postable(s.labels, s.annotations, min(s.starts_at, ends), ends), s))
        for a in self.open.values():
            if self._due(a.last_sent, now) and (not held_only or self.held(a, now)):
                out.append(Outgoing(self._firing(a, now), a))
        return out

    def held(self, a: OpenAlert, now: float) -> bool:
        """Whether Alertmanager still holds ``a`` firing from a delivery (before a restart too): its endsAt not passed.
        Before the service caught up with the findings (a restart, Kafka away) only these are re-sent: one expired
        there may have cleared in a record not read yet, and re-sent it would page a second time."""
        sent = a.last_sent if a.last_sent is not None else self._restored_sent.get(a.finding_id)
        return a.delivered_once and sent is not None and sent + self.alert_ttl_s > now

    def _firing(self, a: OpenAlert, now: float) -> dict[str, Any]:
        # started by now at the latest: a producer's clock ahead of ours (or ours stepped back by more than
        # alert_ttl_s) made startsAt later than endsAt, which Alertmanager refuses
        return postable(*a.outgoing(), min(a.starts_at, now), now + self.alert_ttl_s)

    def rejected(self, refused: Outgoing, reason: str, now: float) -> dict[str, Any] | None:
        """Alertmanager refused ``refused`` (one of ``outgoing(now)``) for ``reason``: the alert to post in its place.

        None when it is a fallback itself (nothing simpler is left to try: the page is lost). The open alert
        refused is sent as its fallback from now on; a refused resolve is replaced by its fallback's.
        """
        labels, record = refused.alert["labels"], refused.record
        if is_fallback(labels):
            return None
        if isinstance(record, OpenAlert):
            record.rejected = str(reason)[:MAX_REJECTION_REASON]
            return self._firing(record, now)
        fid = record.finding_id
        return postable(fallback_labels(labels, fid), _fallback_annotations(labels, record.annotations, fid,
                                                                            str(reason)),
                        record.starts_at, record.ends_at)

    def next_due(self, now: float) -> float:
        """Seconds until something is due (0 when something is due now)."""
        if self.resolves:
            return 0.0
        waits = [self._next_send(a.last_sent, now) - now for a in self.open.values()]
        waits += [at - now for s in self.resolved.values() if (at := self._resend_at(s, now)) is not None]
        return max(0.0, min(waits)) if waits else float("inf")

    def _next_send(self, last_sent: float | None, now: float) -> float:
        """When an alert last sent at ``last_sent`` is sent again: ``now`` if never sent (restored) or if sent "after"
        now (the wall clock stepped back since: waiting for the lost time paused every re-send, and the alerts
        expired in Alertmanager at their endsAt), else a re-send interval after it."""
        if last_sent is None or last_sent > now:
            return now
        return last_sent + self.resend_interval_s

    def _due(self, last_sent: float | None, now: float) -> bool:
        """Whether it is sent again at ``now`` (:meth:`_next_send`)."""
        return last_sent is None or last_sent > now or now - last_sent >= self.resend_interval_s

    def _resend_at(self, s: SentResolve, now: float) -> float | None:
        """When ``s`` is re-sent next (``now`` for a restored one); None when never again: its retention ends
        first, or an alert of its labels is open again (the firing one stands)."""
        until = s.ends_at + self.resend_resolved_s
        at = self._next_send(s.last_sent, now)
        if now >= until or at >= until:
            return None
        a = self.open.get(s.finding_id)
        if a is not None and a.outgoing()[0] == s.labels:   # the fallback's labels too, once it is refused
            return None
        return at

    def _resends_due(self, now: float) -> list[SentResolve]:
        return [s for s in self.resolved.values() if (at := self._resend_at(s, now)) is not None and at <= now]

    def forget_resolved(self, s: SentResolve) -> None:
        """Re-send ``s`` no more (Alertmanager refused its re-send: it took it before, nothing is lost)."""
        if self.resolved.get(_key(s.finding_id, s.labels)) is s:
            del self.resolved[_key(s.finding_id, s.labels)]

    def lost(self, refused: Outgoing, now: float) -> bool:
        """Alertmanager refused ``refused`` (one of ``outgoing(now)``) and its fallback: nothing reached it.

        True when this counts as a page lost: an open alert's first loss (tried again at the re-send interval,
        it counts no more until it is delivered or cleared), a resolve's unless it ends a page counted lost."""
        record = refused.record
        if isinstance(record, PendingResolve):
            return not record.page_lost
        record.lost_tries += 1
        if record.lost_at is not None:
            return False
        record.lost_at = now
        return True

    def delivered(self, now: float, lost: Collection[OpenAlert | PendingResolve] = (),
                  replaced: Collection[Outgoing] = (), held_only: bool = False) -> Delivered:
        """Mark what ``due(now)`` returned as delivered: alerts paged for the first time, resolves sent, alerts
        delivered after being lost. ``lost``: the records (of ``outgoing(now)``) marked by :meth:`lost`: sent
        (tried again at the re-send interval, not at once), but not delivered. ``replaced``: the fallbacks
        Alertmanager took in place of a refused alert, each with its record (a resolve is re-sent as its fallback).
        ``held_only``: what ``outgoing(now, held_only=True)`` returned (the best-effort resolves stay queued)."""
        refused = {id(r) for r in lost}   # by record, not finding id: a severity change posts two of one id
        for s in self._resends_due(now):
            s.last_sent = now
        first: list[OpenAlert] = []
        late: list[Late] = []
        for a in self.open.values():
            if self._due(a.last_sent, now) and (not held_only or self.held(a, now)):
                a.last_sent = now
                self._restored_sent.pop(a.finding_id, None)
                if id(a) in refused:
                    continue
                if not a.delivered_once:
                    first.append(a)
                if a.lost_at is not None:
                    late.append(Late(a, a.lost_at, a.lost_tries))
                    a.lost_at, a.lost_tries = None, 0
                a.delivered_once = True
        queued = self._queued
        self._keep_resolved(now, refused, {id(o.record): o.alert for o in replaced})   # best-effort ones skipped
        if held_only:
            for fid in list(self.resolves):
                queue = self.resolves[fid]
                queue[:] = [r for r in queue if r.best_effort]
                if not queue:
                    del self.resolves[fid]
            self._queued = sum(len(q) for q in self.resolves.values())   # _best_effort still names their ids
        else:
            self.resolves.clear()
            self._best_effort.clear()
            self._queued = 0
        return Delivered(first, queued - self._queued, late)

    def _keep_resolved(self, now: float, refused: set[int], replaced: dict[int, dict[str, Any]]) -> None:
        """The queued resolves just delivered join the ones re-sent for ``resend_resolved_s``."""
        self._expire_resolved(now)
        if self.resend_resolved_s <= 0:
            return
        for queue in self.resolves.values():
            for r in queue:
                if r.best_effort or id(r) in refused:   # never paged from here, or nothing reached Alertmanager
                    continue
                sent = replaced.get(id(r))
                labels, annotations = (sent["labels"], sent["annotations"]) if sent else (r.labels, r.annotations)
                a = self.open.get(r.finding_id)
                if a is not None and a.outgoing()[0] == labels:
                    continue   # open again before the resolve went out: that alert stands
                key = _key(r.finding_id, labels)
                self.resolved.pop(key, None)   # re-inserted: now the newest
                self.resolved[key] = SentResolve(r.finding_id, labels, annotations, r.starts_at, r.ends_at,
                                                 page_lost=r.page_lost, last_sent=now)
        while len(self.resolved) > self.max_pending_resolves:
            del self.resolved[next(iter(self.resolved))]

    def _expire_resolved(self, now: float) -> None:
        for key in [k for k, s in self.resolved.items() if now >= s.ends_at + self.resend_resolved_s]:
            del self.resolved[key]   # past its retention: the next save leaves it out

    def lost_pages(self) -> int:
        """Open alerts lost right now (refused with their fallback at their last try): the service's gauge, which
        stays up while they are refused at their re-sends, where the lost counter counted each once."""
        return sum(1 for a in self.open.values() if a.lost_at is not None)

    def pending(self, now: float) -> int:
        """How many alerts ``due(now)`` would return, without building them (the service asks every step)."""
        firing = sum(1 for a in self.open.values()
                     if self._due(a.last_sent, now))
        return self._queued + len(self._resends_due(now)) + firing

    # -- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION,
                "open": [_open_entry(a, self._restored_sent.get(a.finding_id)) for a in self.open.values()],
                "resolves": [_resolve_entry(r) for q in self.resolves.values() for r in q],
                "resolved": [_resolve_entry(s) for s in self.resolved.values()],
                "closed": [[fid, *mark] for fid, mark in self.closed.items()],
                "cleared": [[fid, *marks] for fid, marks in self.cleared.items()]}

    def restore(self, doc: dict[str, Any]) -> None:
        """Load saved state. Restored alerts are re-sent at once (same labels: no new page)."""
        if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
            found = doc.get("version") if isinstance(doc, dict) else doc
            raise ValueError(f"paging state: unsupported version {found!r}")
        # Built aside and checked entry by entry: a file that is JSON but holds wrong types is refused
        # whole (ValueError, a re-page at worst) instead of failing every delivery after it loads.
        opened: dict[str, OpenAlert] = {}
        for i, a in enumerate(_entries(doc, "open")):
            if isinstance(a, dict):   # a file from before the incident marks: the record it opened on
                a = {"first_seen": a.get("starts_at"), "last_seen": a.get("event_time"), **a}
            alert = _checked(OpenAlert, a, f"open[{i}]")
            opened[alert.finding_id] = alert
        pending = [_checked(PendingResolve, r, f"resolves[{i}]") for i, r in enumerate(_entries(doc, "resolves"))]
        closed = dict(_closed_mark(m, f"closed[{i}]") for i, m in enumerate(_entries(doc, "closed")))
        # absent from a file from before it: then only the newest closed incident is known cleared
        cleared = dict(_cleared_marks(m, f"cleared[{i}]") for i, m in enumerate(_entries(doc, "cleared")))
        # absent from a file from before it: nothing re-sent
        sent = [_checked(SentResolve, s, f"resolved[{i}]") for i, s in enumerate(_entries(doc, "resolved"))]
        self.open, self.resolves, self.closed = opened, {}, dict(list(closed.items())[-MAX_CLOSED:])
        self.cleared = dict(list(cleared.items())[-MAX_CLOSED:])
        self._best_effort, self._queued = {}, 0
        self._restored_sent = {fid: a.last_sent for fid, a in opened.items() if a.last_sent is not None}
        for a in opened.values():
            a.last_sent = None   # re-sent at once (held ones before the service caught up too)
        self.resolved = {_key(s.finding_id, s.labels): s for s in sent[-self.max_pending_resolves:]}
        for s in self.resolved.values():
            s.last_sent = None   # re-sent at once, as the open alerts are
        for r in pending:   # the bound applies to a saved queue too (a state file from before it, a lower bound)
            self._queue_resolve(r)


def _fallback_annotations(labels: dict[str, str], annotations: dict[str, str], finding_id: str,
                          reason: str) -> dict[str, str]:
    """The fallback's annotations (``mapping.fallback_annotations``), each short when the alert was too large."""
    doc = fallback_annotations(labels, annotations, finding_id, reason)
    if not reason.startswith(TOO_LARGE):
        return doc
    # the links whole (a cut one leads nowhere), the texts short
    return {k: v if len(v) <= MAX_SHORT_ANNOTATION or k.endswith("_url") else v[:MAX_SHORT_ANNOTATION - 1] + "…"
            for k, v in doc.items()}


def _open_entry(a: OpenAlert, restored_sent: float | None = None) -> dict[str, Any]:
    entry = asdict(a)
    if entry["last_sent"] is None:   # restored, not sent since: its last send before the restart (held())
        entry["last_sent"] = restored_sent
    # written only when set: a file without refused (or lost) alerts still loads in older versions
    for key, unset in (("rejected", ""), ("lost_at", None), ("lost_tries", 0)):
        if entry[key] == unset:
            del entry[key]
    return entry


def _resolve_entry(r: PendingResolve) -> dict[str, Any]:
    entry = asdict(r)
    if not entry["page_lost"]:   # as in _open_entry
        del entry["page_lost"]
    entry.pop("last_sent", None)   # a SentResolve's: restored ones are re-sent at once
    return entry


def _key(fid: str, labels: dict[str, str]) -> LabelKey:
    return fid, tuple(sorted(labels.items()))


def _entries(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key) or []
    if not isinstance(value, list):
        raise ValueError(f"paging state: {key} is a {type(value).__name__}, not a list")
    return value


def _checked(cls: type[Any], doc: Any, where: str) -> Any:
    """One saved entry with the types :meth:`PagingBook.due` relies on, or ValueError naming it."""
    if not isinstance(doc, dict):
        raise ValueError(f"paging state: {where} is not an object")
    try:
        entry = cls(**doc)
    except TypeError as e:
        raise ValueError(f"paging state: {where}: {e}") from None
    for name in ("labels", "annotations"):
        value = getattr(entry, name)
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ValueError(f"paging state: {where}.{name} is not a map of strings")
    for name in ("starts_at", "event_time", "ends_at", "last_sent", "first_seen", "last_seen", "lost_at"):
        value = getattr(entry, name, 0.0)
        if value is None and name in ("last_sent", "lost_at"):
            continue
        # within what an alert's RFC 3339 stamps can say: a finite -1e13 loaded, and every due() after it raised
        if not is_time(value):
            raise ValueError(f"paging state: {where}.{name} is {value!r}, not a time")
    if not isinstance(entry.finding_id, str) or not all(
            isinstance(getattr(entry, flag, False), bool) for flag in ("delivered_once", "best_effort", "page_lost")):
        raise ValueError(f"paging state: {where}: finding_id must be a string, delivered_once, best_effort and "
                         f"page_lost booleans")
    tries = getattr(entry, "lost_tries", 0)
    if not isinstance(tries, int) or isinstance(tries, bool) or tries < 0:
        raise ValueError(f"paging state: {where}.lost_tries is {tries!r}, not a count")
    if not isinstance(getattr(entry, "rejected", ""), str):
        raise ValueError(f"paging state: {where}.rejected is not a string")
    return entry


def _closed_mark(doc: Any, where: str) -> tuple[str, tuple[float, float, bool]]:
    """One saved ``[finding_id, first_seen, last_seen, cleared]``, or ValueError naming it."""
    if (not isinstance(doc, list) or len(doc) != 4 or not isinstance(doc[0], str)
            or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) for t in doc[1:3])
            or not isinstance(doc[3], bool)):
        raise ValueError(f"paging state: {where} is not [finding_id, first_seen, last_seen, cleared]")
    return doc[0], (float(doc[1]), float(doc[2]), doc[3])


def _cleared_marks(doc: Any, where: str) -> tuple[str, tuple[float, ...]]:
    """One saved ``[finding_id, first_seen, ...]`` of cleared incidents, or ValueError naming it."""
    if (not isinstance(doc, list) or len(doc) < 2 or not isinstance(doc[0], str)
            or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) for t in doc[1:])):
        raise ValueError(f"paging state: {where} is not [finding_id, first_seen, ...]")
    return doc[0], tuple(float(t) for t in doc[1:])[-MAX_CLEARED_PER_ID:]


def _rank(severity: str | None) -> int:
    """The paging rank of a severity label value (-1 when it is none we know)."""
    try:
        return SEVERITY_RANK[Severity(severity)]
    except ValueError:
        return -1
