"""`opsloop audit`: search the audit trail in Elasticsearch and install its index templates."""

from __future__ import annotations

import argparse
import sys

import orjson

from opsloop.records import AuditError
from opsloop.audit.search import INDEX_PATTERN, parse_duration, parse_time, render, why_query, why_weights_changed
from opsloop.audit.templates import AUDIT_TEMPLATE, LOGS_TEMPLATE, install_template
from opsloop.audit.settings import AuditSettings
from opsloop.config import ConfigError, load_settings
from opsloop.es_client import ElasticsearchSettings, check_url

DEFAULT_ES = "http://127.0.0.1:29200"

EPILOG = """examples:
  # why did the weights of edge ams1 change at 03:12 (UTC)? records of the 10 minutes before, oldest first
  opsloop audit search --edge ams1 --at 2026-11-22T03:12
  opsloop audit search --edge ams1 --at 2026-11-22T04:12+01:00 --window 30m --es http://127.0.0.1:9200
  opsloop audit search --edge ams1 --at 2026-11-22T03:12 --json     # the raw records, one JSON per line
  opsloop audit search --edge ams1 --at 2026-11-22T03:12 --show-query   # the Elasticsearch query, for Kibana
  opsloop audit install-templates --config opsloop.yaml             # audit + Filebeat log templates

The Elasticsearch URL comes from --es, else controllers.audit.elasticsearch_url in --config, else
http://127.0.0.1:29200. `search` prints at most the newest 200 records of the window and says how many
earlier ones it left out; a hit that is not a valid audit record is skipped and named. It exits 0 when
records were found, 1 when none, 2 on bad input, an unreachable Elasticsearch or only unreadable hits.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsloop audit", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("search", help="why did the weights of an edge change at a given time?",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--edge", required=True, help="edge node name (the `edge` of the audit records)")
    s.add_argument("--at", required=True, help="ISO 8601 time, UTC unless a zone is given (2026-11-22T03:12)")
    s.add_argument("--window", default="10m", help="how far back from that minute to look (default 10m)")
    s.add_argument("--index", default=INDEX_PATTERN, help=f"index or data stream pattern (default {INDEX_PATTERN})")
    s.add_argument("--json", action="store_true", help="print the matching records as JSON lines")
    s.add_argument("--show-query", action="store_true", help="print the Elasticsearch query and exit")
    t = sub.add_parser("install-templates", help="install the audit and log index templates (idempotent)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    for sp in (s, t):
        sp.add_argument("--es", help=f"Elasticsearch URL (default: config, else {DEFAULT_ES})")
        sp.add_argument("--config", help="opsloop.yaml (for controllers.audit.elasticsearch_url)")
    return p


def es_url_from_args(args: argparse.Namespace) -> str:
    """--es, else controllers.audit.elasticsearch_url in --config, else the local default."""
    return es_from_args(args).describe()


def es_from_args(args: argparse.Namespace) -> ElasticsearchSettings:
    """The connection: hosts from --es, else the config's audit Elasticsearch, else the local default;
    auth and CA from the config (``audit.elasticsearch``) either way."""
    es = AuditSettings.from_settings(load_settings(args.config)).es() if args.config else None
    es = es or ElasticsearchSettings()
    if args.es:
        return es.with_hosts([check_url(str(args.es), "--es")])
    return es if es.hosts else es.with_hosts([DEFAULT_ES])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        es = es_from_args(args)
        url = es.describe()   # hosts only: credentials never in a printed URL
        if args.command == "install-templates":
            client = es.client()
            for name in (AUDIT_TEMPLATE, LOGS_TEMPLATE):
                install_template(client, name)
                print(f"installed index template {name}")
            return 0
        at, window = parse_time(args.at), parse_duration(args.window)
        if args.show_query:
            print(orjson.dumps(why_query(args.edge, at, window), option=orjson.OPT_INDENT_2).decode())
            return 0
        answer = why_weights_changed(es.client(), args.edge, at, window, args.index)
    except (ValueError, ConfigError, AuditError) as e:
        print(f"opsloop audit: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - connection refused, timeouts, HTTP errors: say which and where
        print(f"opsloop audit: Elasticsearch at {url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.json:
        for r in answer.records:
            sys.stdout.write(r.encode().decode() + "\n")
        if answer.left_out:   # stdout stays JSON lines; the cut is said where a pipe does not hide it
            print(f"opsloop audit: the newest {len(answer.records)} of {answer.total} records; {answer.left_out} "
                  f"earlier ones left out (an earlier --at shows them)", file=sys.stderr)
        for u in answer.unreadable:
            print(f"opsloop audit: skipped a document that is not a valid audit record: {u}", file=sys.stderr)
    else:
        print(render(answer))
    if answer.records:
        return 0
    return 2 if answer.unreadable else 1   # "nothing happened" only when nothing matched at all


if __name__ == "__main__":
    sys.exit(main())
