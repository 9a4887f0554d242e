"""Open findings of one detector: open, refresh and clear them, with a JSON-able state.

A domain detector decides *whether* something is wrong; the book turns that into the finding
lifecycle of ``opsloop.records.Finding``: the first time a condition holds it opens a finding
(``first_seen``), while it holds it refreshes it (``last_seen``, observed, score), and when it stops
holding it emits the finding once more with ``cleared=True`` and forgets it. A detector restored
from its state therefore never repeats an open finding as new nor forgets to clear one.

The book also decides what is worth *publishing* (the ``outbox``): a detector re-raises a held
condition on every sample, but the findings topic should carry events, not a copy of every
sample. An entry goes to the outbox when a finding opens, changes severity, clears, or has not
been published for ``refresh_s`` seconds of event time (a heartbeat so that a consumer that
started late learns about it). Publication times are part of the state, so a restarted worker
neither re-announces an open finding as new nor heartbeats it early.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from pydantic import ValidationError

from opsloop.records import Finding, Severity
from opsloop.labels import label_string
from opsloop.runbooks import finding_runbook_url
from opsloop.validation import describe_validation_error
from opsloop.streams.detectors.state_check import StateError, event_time, obj

DEFAULT_REFRESH_S = 300.0
# Offline users (replay, evaluation) never drain the outbox: keep only the newest events.
MAX_OUTBOX = 10_000

# Outbox events (sent as the ``event`` header of the findings record).
OPENED, UPDATED, REFRESHED, CLEARED = "opened", "updated", "refreshed", "cleared"
# The largest magnitude of a number a restored finding may carry (observed, expected): the anomaly
# detector's values go up to 1e50 (its MAX_ABS_VALUE); anything beyond is a damaged state.
MAX_FINDING_NUMBER = 1e60


def where_key(detector: str, where: dict[str, str]) -> str:
    return detector + "|" + label_string(where)


def runbook_url(detector: str, given: str = "") -> str:
    """An absolute runbook link; otherwise the finding type's section in docs/runbooks (opsloop.runbooks)."""
    if given.startswith(("http://", "https://")):
        return given
    return finding_runbook_url(detector)


class FindingBook:
    def __init__(self, refresh_s: float = DEFAULT_REFRESH_S) -> None:
        self.open: dict[str, dict[str, Any]] = {}
        self.published: dict[str, float] = {}          # key -> event time it was last published
        self.refresh_s = refresh_s
        self.outbox: list[tuple[str, Finding]] = []     # (event, finding) not yet handed to the sink
        # split() per label until the next change: state_of(key) splits once per touched key, which
        # is quadratic in the open findings when every key has one (e.g. power.cost per host)
        self._version = 0
        self._splits: dict[str, tuple[int, dict[str, FindingBook]]] = {}

    def raise_(self, *, detector: str, what: str, where: dict[str, str], observed: float | str | None,
               expected: float | str | None, score: float, severity: Severity, explanation: str,
               now: float, runbook: str = "") -> Finding:
        """Open or refresh the finding for (detector, where)."""
        key = where_key(detector, where)
        prev = self.open.get(key)
        first_seen = prev["first_seen"] if prev else now
        finding = Finding(detector=detector, what=what, where=dict(where), observed=observed,
                          expected=expected, score=min(1.0, max(0.0, score)), severity=severity,
                          explanation=explanation, first_seen=first_seen, last_seen=max(now, first_seen),
                          runbook=runbook_url(detector, runbook))   # dashboard: the paging actuator's Grafana base
        self.open[key] = finding.model_dump(mode="json")
        self._version += 1
        if prev is None:
            self._publish(key, OPENED, finding, now)
        elif prev["severity"] != finding.severity.value:
            self._publish(key, UPDATED, finding, now)
        elif now - self.published.get(key, first_seen) >= self.refresh_s:
            self._publish(key, REFRESHED, finding, now)
        return finding

    def clear(self, detector: str, where: dict[str, str], now: float, explanation: str) -> Finding | None:
        """Close the finding for (detector, where) if open; return the cleared finding."""
        if not self.open:
            return None   # the common case, without building the key
        key = where_key(detector, where)
        doc = self.open.pop(key, None)
        if doc is None:
            return None
        self._version += 1
        self.published.pop(key, None)
        doc.update(cleared=True, last_seen=max(now, doc["first_seen"]), explanation=explanation, score=0.0)
        finding = Finding.model_validate(doc)
        self._append(CLEARED, finding)
        return finding

    def clear_all_except(self, detector: str, keep: set[str], now: float, explanation: str,
                         match: dict[str, str] | None = None) -> list[Finding]:
        """Clear every open finding of `detector` (whose labels include `match`) not in `keep`."""
        out = []
        for key, doc in list(self.open.items()):
            if doc["detector"] != detector or key in keep:
                continue
            if match and any(doc["where"].get(k) != v for k, v in match.items()):
                continue
            cleared = self.clear(detector, doc["where"], now, explanation)
            if cleared is not None:
                out.append(cleared)
        return out

    def is_open(self, detector: str, where: dict[str, str]) -> bool:
        return where_key(detector, where) in self.open

    def open_findings(self) -> list[Finding]:
        return [Finding.model_validate(d) for d in self.open.values()]

    def drain(self) -> list[tuple[str, Finding]]:
        """The (event, finding) pairs to publish since the last drain."""
        out, self.outbox = self.outbox, []
        return out

    def _publish(self, key: str, event: str, finding: Finding, now: float) -> None:
        self.published[key] = now
        self._append(event, finding)

    def _append(self, event: str, finding: Finding) -> None:
        self.outbox.append((event, finding))
        if len(self.outbox) > MAX_OUTBOX:
            del self.outbox[: len(self.outbox) - MAX_OUTBOX]

    # ------------------------------------------------------------------------------------- state
    def to_dict(self) -> dict[str, Any]:
        return {"open": dict(self.open), "published": dict(self.published)}

    @classmethod
    def from_dict(cls, doc: Any, refresh_s: float = DEFAULT_REFRESH_S, field: str = "book") -> "FindingBook":
        """The book of a stored state, every entry checked (:mod:`~opsloop.streams.detectors.state_check`):
        StateError naming ``field`` and the entry when an open finding is not one a book holds (a wrong type,
        a time that is no event time, a number that is not finite, kept under another finding's key). Before,
        such an entry loaded, and building the finding raised at every restore and batch after it."""
        doc = obj(doc, field)
        book = cls(refresh_s)
        for key, entry in obj(doc.get("open", {}), f"{field}.open").items():
            book.open[key] = _open_entry(key, entry, f"{field}.open[{key!r}]")
        for key, t in obj(doc.get("published", {}), f"{field}.published").items():
            if key in book.open:
                book.published[key] = event_time(t, f"{field}.published[{key!r}]")
        return book

    def check_about(self, labels: Mapping[str, str], field: str = "book") -> None:
        """StateError unless every open finding carries ``labels`` (a state key's findings are about it:
        its handler clears them with its key, by these labels)."""
        for key, doc in self.open.items():
            where = doc["where"]
            for label, value in labels.items():
                if where.get(label) != value:
                    raise StateError(f"{field}.open[{key!r}].where.{label}",
                                     f"{where.get(label)!r:.60} in the state of {value!r:.60}")

    def split(self, label: str) -> dict[str, "FindingBook"]:
        """One book per value of the ``where`` label ``label`` (entries without it go under "").

        The parts are shared until the book changes: read them, do not modify them."""
        cached = self._splits.get(label)
        if cached is not None and cached[0] == self._version:
            return cached[1]
        out: dict[str, FindingBook] = {}
        for key, doc in self.open.items():
            part = out.setdefault(str(doc["where"].get(label, "")), FindingBook(self.refresh_s))
            part.open[key] = doc
            if key in self.published:
                part.published[key] = self.published[key]
        self._splits = {label: (self._version, out)}
        return out

    def merge(self, other: "FindingBook") -> None:
        """Add the open findings of ``other`` (restoring a detector from per-key parts)."""
        self.open.update(other.open)
        self.published.update(other.published)
        self._version += 1


def _open_entry(key: str, entry: Any, field: str) -> dict[str, Any]:
    """One stored open finding as :meth:`FindingBook.raise_` writes it, or StateError naming ``field``."""
    try:
        finding = Finding.model_validate(obj(entry, field))
    except ValidationError as e:
        raise StateError(field, describe_validation_error(e)) from None
    event_time(finding.first_seen, f"{field}.first_seen")
    event_time(finding.last_seen, f"{field}.last_seen")
    if finding.last_seen < finding.first_seen:
        raise StateError(f"{field}.last_seen", f"{finding.last_seen!r} is before first_seen {finding.first_seen!r}")
    for name in ("observed", "expected"):
        v = getattr(finding, name)
        if isinstance(v, float) and not (math.isfinite(v) and abs(v) <= MAX_FINDING_NUMBER):
            raise StateError(f"{field}.{name}", f"{v!r} is not a finite number a detector reports")
    if finding.cleared:
        raise StateError(f"{field}.cleared", "an open finding marked cleared")
    if where_key(finding.detector, finding.where) != key:
        raise StateError(field, f"kept under the key of another finding (its own is "
                                f"{where_key(finding.detector, finding.where)!r:.100})")
    return finding.model_dump(mode="json")
