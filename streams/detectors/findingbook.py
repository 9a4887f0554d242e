"""Open findings of one detector: open, refresh and clear them, with a JSON-able state.

A domain detector decides *whether* something is wrong; the book turns that into the finding
lifecycle of ``opsloop.findings.Finding``: the first time a condition holds it opens a finding
(``first_seen``), while it holds it refreshes it (``last_seen``, observed, score), and when it stops
holding it emits the finding once more with ``cleared=True`` and forgets it. A detector restored
from its state therefore never repeats an open finding as new nor forgets to clear one.
"""

from __future__ import annotations

from typing import Any

from opsloop.findings import Finding, Severity


def where_key(detector: str, where: dict[str, str]) -> str:
    return detector + "|" + ",".join(f"{k}={v}" for k, v in sorted(where.items()))


class FindingBook:
    def __init__(self) -> None:
        self.open: dict[str, dict[str, Any]] = {}

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
                          runbook=runbook)
        self.open[key] = finding.model_dump(mode="json")
        return finding

    def clear(self, detector: str, where: dict[str, str], now: float, explanation: str) -> Finding | None:
        """Close the finding for (detector, where) if open; return the cleared finding."""
        doc = self.open.pop(where_key(detector, where), None)
        if doc is None:
            return None
        doc.update(cleared=True, last_seen=max(now, doc["first_seen"]), explanation=explanation, score=0.0)
        return Finding.model_validate(doc)

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

    def to_dict(self) -> dict[str, Any]:
        return {"open": dict(self.open)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "FindingBook":
        book = cls()
        book.open = {k: dict(v) for k, v in doc.get("open", {}).items()}
        return book
