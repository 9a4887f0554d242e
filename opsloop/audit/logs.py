"""An operator's search over the shipped service logs: "what did opsloop-edge warn about in the last 10 min?".

The logs are the ``opsloop-logs-*`` indices that Filebeat's journald input (or Journalbeat) writes
from the journal (docker-compose/filebeat.yml, journalbeat.yml). One query, newest ``limit`` lines
in the time range, printed oldest first like ``journalctl``::

    GET opsloop-logs-*/_search
    {"size": 200, "sort": [{"@timestamp": "desc"}],
     "query": {"bool": {"filter": [
         {"range": {"@timestamp": {"gte": "now-10m"}}},              # no upper bound without --until
         {"bool": {"minimum_should_match": 1, "should": [          # --unit opsloop-edge
             {"terms": {"systemd.unit": ["opsloop-edge", "opsloop-edge.service"]}},
             {"prefix": {"systemd.unit": "opsloop-edge@"}},       # template instances
             {"regexp": {"container.name": "(.+[-_])?opsloop-edge([-_][0-9]+)?"}}]}},   # Compose's containers
         {"bool": {"minimum_should_match": 1, "should": [          # --level warning
             {"terms": {"opsloop.level": ["warning", "error", "critical"]}},
             {"bool": {"must_not": {"exists": {"field": "opsloop.level"}},
                       "filter": {"range": {"syslog.priority": {"lte": 4}}}}}]}}]}}}

opsloop's own lines carry their level in the decoded JSON (``opsloop.level``); other services'
lines (Horizon's Apache) only have the journal's syslog priority, so ``--level`` means "this
severity or worse" in either form.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from opsloop.dotted import get_dotted

LOGS_INDEX_PATTERN = "opsloop-logs-*"
MAX_LIMIT = 10_000
# opsloop's levels (opsloop/log.py writes logging's level names in lower case), least severe first,
# with the syslog priority each corresponds to (RFC 5424: 0 emerg .. 7 debug).
LEVELS: dict[str, int] = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
_PRIORITY_NAMES = {0: "emerg", 1: "alert", 2: "critical", 3: "error", 4: "warning", 5: "notice", 6: "info", 7: "debug"}


@dataclass(frozen=True, slots=True)
class LogQuery:
    since: timedelta
    until: datetime
    units: tuple[str, ...] = ()
    level: str | None = None
    text: str | None = None
    limit: int = 200
    # no --until: no upper bound, so lines stamped ahead of this clock (a host whose clock was ahead, stepped
    # back by NTP) are shown as the newest instead of hidden until the wall clock catches up with them
    open_ended: bool = False

    def __post_init__(self) -> None:
        if self.level is not None and self.level not in LEVELS:
            raise ValueError(f"--level {self.level!r}: expected one of {', '.join(LEVELS)}")
        if not 0 < self.limit <= MAX_LIMIT:
            raise ValueError(f"--limit {self.limit}: must be between 1 and {MAX_LIMIT}")
        for unit in self.units:
            if not unit.strip():
                raise ValueError("--unit: empty unit name")


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


_REGEXP_RESERVED = set('.?+*|{}[]()"\\#@&<>~')


def _container_regexp(service: str) -> str:
    """The container of a Compose service: ``edge-control`` or ``<project>-edge-control-1`` (``_`` in Compose v1)."""
    escaped = "".join(f"\\{c}" if c in _REGEXP_RESERVED else c for c in service)
    return f"(.+[-_])?{escaped}([-_][0-9]+)?"


def _unit_clause(unit: str) -> dict[str, Any]:
    """A unit as systemd names it (opsloop-edge, opsloop-edge.service, opsloop-collector@ipmi) or a container."""
    names = [unit] if "." in unit else [unit, f"{unit}.service"]
    should: list[dict[str, Any]] = [{"terms": {"systemd.unit": names}},
                                    {"regexp": {"container.name": _container_regexp(unit)}}]
    if "@" not in unit and "." not in unit:
        should.append({"prefix": {"systemd.unit": f"{unit}@"}})
    return {"bool": {"minimum_should_match": 1, "should": should}}


def _level_clause(level: str) -> dict[str, Any]:
    names = [n for n, p in LEVELS.items() if p <= LEVELS[level]]
    return {"bool": {"minimum_should_match": 1, "should": [
        {"terms": {"opsloop.level": names}},
        {"bool": {"must_not": {"exists": {"field": "opsloop.level"}},
                  "filter": {"range": {"syslog.priority": {"lte": LEVELS[level]}}}}},
    ]}}


def logs_query(q: LogQuery) -> dict[str, Any]:
    """The Elasticsearch query body (documented above), newest first."""
    bounds = {"gte": _iso(q.until - q.since)}
    if not q.open_ended:
        bounds["lte"] = _iso(q.until)
    filters: list[dict[str, Any]] = [{"range": {"@timestamp": bounds}}]
    if q.units:
        clauses = [_unit_clause(u.strip()) for u in q.units]
        filters.append(clauses[0] if len(clauses) == 1 else {"bool": {"minimum_should_match": 1, "should": clauses}})
    if q.level:
        filters.append(_level_clause(q.level))
    if q.text:
        filters.append({"match_phrase": {"message": q.text}})
    return {"size": q.limit, "sort": [{"@timestamp": "desc"}], "query": {"bool": {"filter": filters}}}


def search_logs(client: Any, q: LogQuery, index: str = LOGS_INDEX_PATTERN) -> list[dict[str, Any]]:
    """The matching documents' sources, oldest first."""
    resp = client.search(index=index, ignore_unavailable=True, allow_no_indices=True, **logs_query(q))
    return [h["_source"] for h in reversed(resp["hits"]["hits"])]


def stamped_after(docs: list[dict[str, Any]], t: datetime) -> int:
    """How many documents carry an ``@timestamp`` later than ``t`` (their host's clock is ahead)."""
    n = 0
    for doc in docs:
        stamp = doc.get("@timestamp")
        try:
            if isinstance(stamp, str) and datetime.fromisoformat(stamp.replace("Z", "+00:00")) > t:
                n += 1
        except (ValueError, TypeError):   # a stamp this reader cannot parse: not counted, still printed
            continue
    return n


def _field(doc: dict[str, Any], dotted: str) -> Any:
    """A field whether the shipper nested it (``{"systemd": {"unit": ..}}``) or kept the dots."""
    return get_dotted(doc, dotted, flat_key=True)


def level_of(doc: dict[str, Any]) -> str:
    level = _field(doc, "opsloop.level")
    if isinstance(level, str):
        return level
    prio = _field(doc, "syslog.priority")
    return _PRIORITY_NAMES.get(int(prio), str(prio)) if isinstance(prio, (int, str)) and str(prio).isdigit() else "-"


def render_line(doc: dict[str, Any]) -> str:
    """``time level unit event key=value ...`` for opsloop's lines, ``time level unit message`` otherwise."""
    source = _field(doc, "systemd.unit") or _field(doc, "container.name") or _field(doc, "syslog.identifier") or "-"
    head = f"{doc.get('@timestamp', '-')}  {level_of(doc):<8} {source}"
    event = _field(doc, "opsloop.event")
    if event is None:
        return f"{head}  {doc.get('message', '')}"
    fields = _field(doc, "opsloop.fields") or {}
    kv = " ".join(f"{k}={v}" for k, v in fields.items()) if isinstance(fields, dict) else str(fields)
    return f"{head}  {_field(doc, 'opsloop.service') or '-'}: {event}" + (f"  {kv}" if kv else "")
