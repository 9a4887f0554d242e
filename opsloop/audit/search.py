"""The documented question: "why did the weights of edge X change at 03:12?".

One Elasticsearch query over the audit trail (``opsloop-audit*``): every record about the edge
(weight pushes, holds, rollbacks, pages) from ``window`` before the named minute to the end of
that minute, printed oldest first. At most 200 are fetched: the **newest** 200 (the query sorts newest
first), so that the minute asked about is always in the answer, and the answer says how many
earlier ones it left out (a controller audits every decision of every listener: four listeners at
15 s fill 200 in 12.5 minutes)::

    GET opsloop-audit*/_search
    {"size": 200, "sort": [{"@timestamp": "desc"}], "track_total_hits": true,
     "query": {"bool": {"filter": [
         {"term": {"edge": "ams1"}},
         {"range": {"@timestamp": {"gte": "2026-11-22T03:02:00Z", "lt": "2026-11-22T03:13:00Z"}}}]}}}

Each hit carries who acted (``actor``), what (``action``, ``version``), in which mode (dry-run,
shadow, live), with what result, the weights before and after (``changed`` lists the origins that
moved) and the controller's ``reason`` (e.g. "origin eu over capacity 1.12, shed 30 %"). The
same query in Kibana's Discover: ``edge:"ams1"`` over that time range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from opsloop.records import AuditRecord

INDEX_PATTERN = "opsloop-audit*"
MINUTE = timedelta(minutes=1)
MAX_HITS = 200
MAX_WINDOW = timedelta(days=366)
MIN_YEAR, MAX_YEAR = 2000, 2100   # the wire format's plausible event times
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, flag: str = "--at") -> datetime:
    """ISO 8601 (``2026-11-22T03:12``, ``...03:12:30Z``, ``...+01:00``); without a zone it is UTC."""
    try:
        t = datetime.fromisoformat(text.strip().replace(" ", "T", 1))
        t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        raise ValueError(f"{flag} {text!r}: not an ISO 8601 time; expected e.g. 2026-11-22T03:12 (UTC) or "
                         f"2026-11-22T04:12+01:00") from None
    if not MIN_YEAR <= t.year <= MAX_YEAR:
        raise ValueError(f"{flag} {text!r}: year {t.year} is outside {MIN_YEAR}..{MAX_YEAR}")
    return t


def parse_duration(text: str, flag: str = "--window") -> timedelta:
    """``10m``, ``90s``, ``1h``, ``2d`` or plain seconds; errors name ``flag``."""
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(f"{flag} {text!r}: expected a duration such as 10m, 90s, 1h")
    value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not 0 < value <= MAX_WINDOW.total_seconds():
        raise ValueError(f"{flag} {text!r}: must be longer than zero and at most {MAX_WINDOW.days} days")
    return timedelta(seconds=value)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def why_query(edge: str, at: datetime, window: timedelta) -> dict[str, Any]:
    """The query body (documented above): the newest of the edge's records in
    [minute(at) - window, minute(at) + 1 min), and how many there are in all."""
    minute = at.replace(second=0, microsecond=0)
    return {
        "size": MAX_HITS,
        # newest first: a window holding more than MAX_HITS keeps the minute asked about, not its start
        "sort": [{"@timestamp": "desc"}],
        "track_total_hits": True,
        "query": {"bool": {"filter": [
            {"term": {"edge": edge}},
            {"range": {"@timestamp": {"gte": _iso(minute - window), "lt": _iso(minute + MINUTE)}}},
        ]}},
    }


@dataclass(frozen=True, slots=True)
class WhyAnswer:
    edge: str
    start: datetime
    end: datetime
    records: list[AuditRecord]   # oldest first: the newest MAX_HITS of the window
    total: int | None = None     # records in the window (None: as many as ``records``)
    unreadable: tuple[str, ...] = ()   # "<_id>: why" of documents that are not valid audit records

    @property
    def left_out(self) -> int:
        """Earlier records of the window not in ``records`` (more than MAX_HITS matched)."""
        return max(0, (self.total or 0) - len(self.records))

    @property
    def weight_changes(self) -> list[AuditRecord]:
        """The records that changed weights (live and applied, something moved)."""
        return [r for r in self.records
                if r.action.startswith("edge.weights") and r.mode.value == "live" and r.result == "applied"
                and r.changes()]


def why_weights_changed(client: Any, edge: str, at: datetime, window: timedelta = timedelta(minutes=10),
                        index: str = INDEX_PATTERN) -> WhyAnswer:
    body = why_query(edge, at, window)
    resp = client.search(index=index, ignore_unavailable=True, allow_no_indices=True, **body)
    hits = resp["hits"]
    records: list[AuditRecord] = []
    unreadable: list[str] = []
    for h in reversed(hits["hits"]):
        # one document this version cannot read (a newer writer's mode, a hand-made one) must not hide the rest
        try:
            records.append(AuditRecord.from_document(h.get("_source") or {}))
        except (ValueError, TypeError, OverflowError) as e:   # AuditError is a ValueError
            unreadable.append(f"{h.get('_id')}: {e}"[:300])
    total = hits.get("total")
    minute = at.replace(second=0, microsecond=0)
    return WhyAnswer(edge, minute - window, minute + MINUTE, records,
                     total=int(total["value"]) - len(unreadable) if isinstance(total, dict) else None,
                     unreadable=tuple(unreadable))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "-" if v is None else str(v)


def render(answer: WhyAnswer) -> str:
    """A human answer: one block per record, the weight moves and the reason."""
    head = f"edge {answer.edge}, {_iso(answer.start)} .. {_iso(answer.end)}:"
    bad = [f"    {u}" for u in answer.unreadable]
    if bad:
        bad.insert(0, f"{len(bad)} document(s) not readable as audit records (skipped):")
    if not answer.records and bad:
        return "\n".join([f"{head} no readable audit record.", *bad])
    if not answer.records:
        return (f"{head} no audit record.\nNothing in opsloop acted on this edge then; if its weights changed, "
                f"the change did not come through opsloop (check the load balancer's own logs).")
    lines = [f"{head} {len(answer.records)} audit record(s), {len(answer.weight_changes)} live weight change(s)"]
    if answer.left_out:
        lines.append(f"  (the newest {len(answer.records)} of {answer.total}: {answer.left_out} earlier record(s) "
                     f"left out; an earlier --at shows them)")
    for r in answer.records:
        version = f" v{r.version}" if r.version is not None else ""
        lines.append(f"{r.timestamp}  {r.mode.value:<7} {r.result:<10} {r.action}{version}  by {r.actor}"
                     f"  on {r.target}")
        moves = r.changes()
        if moves:
            lines.append("    " + ", ".join(f"{k}: {_fmt(a)} -> {_fmt(b)}" for k, (a, b) in moves.items()))
        if r.reason:
            lines.append(f"    why: {r.reason}")
        if r.error:
            lines.append(f"    error: {r.error}")
        if r.labels:
            lines.append("    " + ", ".join(f"{k}={v}" for k, v in sorted(r.labels.items())))
    return "\n".join(lines + bad)
