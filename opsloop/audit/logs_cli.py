"""`opsloop logs search`: the service logs shipped from the journal into Elasticsearch (opsloop-logs-*)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

import orjson

from opsloop.audit.cli import DEFAULT_ES, es_from_args
from opsloop.audit.logs import (LEVELS, LOGS_INDEX_PATTERN, LogQuery, logs_query, render_line, search_logs,
                                stamped_after)
from opsloop.audit.search import parse_duration, parse_time
from opsloop.config import ConfigError

EPILOG = f"""examples:
  # what did the edge control service warn about in the last 10 minutes?
  opsloop logs search --unit opsloop-edge --since 10m --level warning
  opsloop logs search --unit opsloop-collector@ipmi --since 1h --grep bmc_timeout
  opsloop logs search --unit apache2 --since 30m --level error          # Horizon behind Apache
  opsloop logs search --unit opsloop-edge --since 2h --until 2026-11-22T03:15 --json
  opsloop logs search --unit opsloop-edge --since 10m --show-query      # the Elasticsearch query

--unit takes a systemd unit (opsloop-edge, opsloop-edge.service, opsloop-collector@ipmi; a bare name
also matches its template instances opsloop-edge@*) or a Docker container name; repeat it for
several. --level is this severity or worse ({', '.join(LEVELS)}): opsloop's own level for its JSON
lines, the journal's syslog priority for other services. The Elasticsearch URL comes from --es,
else controllers.audit.elasticsearch_url in --config, else {DEFAULT_ES}. Exit 0 when lines were
found, 1 when none, 2 on bad input or an unreachable Elasticsearch. Without --until the range has no
end: lines stamped after now (a host's clock ahead) are shown as the newest, and counted on stderr.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsloop logs", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("search", help="service log lines by unit, time range, level and text",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--unit", action="append", default=[], help="systemd unit or container name (repeatable)")
    s.add_argument("--since", default="10m", help="how far back from --until (default 10m)")
    s.add_argument("--until", help="ISO 8601 end of the range, UTC unless a zone is given (default now)")
    s.add_argument("--level", choices=list(LEVELS), help="this severity or worse")
    s.add_argument("--grep", help="a phrase the log line must contain")
    s.add_argument("--limit", type=int, default=200, help="at most this many of the newest lines (default 200)")
    s.add_argument("--index", default=LOGS_INDEX_PATTERN, help=f"index pattern (default {LOGS_INDEX_PATTERN})")
    s.add_argument("--json", action="store_true", help="print the matching documents as JSON lines")
    s.add_argument("--show-query", action="store_true", help="print the Elasticsearch query and exit")
    s.add_argument("--es", help=f"Elasticsearch URL (default: config, else {DEFAULT_ES})")
    s.add_argument("--config", help="opsloop.yaml (for controllers.audit.elasticsearch_url)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        until = parse_time(args.until, "--until") if args.until else datetime.now(timezone.utc)
        q = LogQuery(since=parse_duration(args.since, "--since"), until=until, units=tuple(args.unit),
                     level=args.level, text=args.grep, limit=args.limit, open_ended=not args.until)
        es = es_from_args(args)
        url = es.describe()   # hosts only: credentials never in a printed URL
    except (ValueError, ConfigError) as e:
        print(f"opsloop logs: {e}", file=sys.stderr)
        return 2
    if args.show_query:
        print(orjson.dumps(logs_query(q), option=orjson.OPT_INDENT_2).decode())
        return 0
    try:
        docs = search_logs(es.client(), q, args.index)
    except Exception as e:  # noqa: BLE001 - connection refused, timeouts, HTTP errors: say which and where
        print(f"opsloop logs: Elasticsearch at {url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    for doc in docs:
        print(orjson.dumps(doc).decode() if args.json else render_line(doc))
    if not docs and not args.json:
        print("no log line matched", file=sys.stderr)
    ahead = stamped_after(docs, until) if q.open_ended else 0
    if ahead:
        print(f"opsloop logs: {ahead} line(s) stamped after now ({until.isoformat(timespec='seconds')}): "
              f"the clock of the host that wrote them is or was ahead", file=sys.stderr)
    return 0 if docs else 1


if __name__ == "__main__":
    sys.exit(main())
