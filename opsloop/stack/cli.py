"""`opsloop stack up|down|status`: the local real stack, on loopback ports from the config."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson

from opsloop.config import ConfigError, load_settings
from opsloop.stack.manager import Stack
from opsloop.stack.process import ManagedProcess, StackError

EPILOG = """examples:
  opsloop stack up                       # default ports: Kafka 29092, Prometheus 29090, Alertmanager 29094
  opsloop stack up --config opsloop.yaml
  opsloop stack status                   # a table: component, state, PID, ports, log file
  opsloop stack status --json
  opsloop stack down                     # stops each component by its PID
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsloop stack", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["up", "down", "status"],
                   help="up: start each component (progress on stderr); down: stop them by PID; "
                        "status: a table (or --json)")
    p.add_argument("--config", help="opsloop YAML config (the `stack` section)")
    p.add_argument("--json", action="store_true", help="status as JSON")
    return p


_started: dict[str, float] = {}  # component -> monotonic start, for "ready after N s"


def _progress(event: str, comp: ManagedProcess) -> None:
    """One stderr line per component as it starts and as it becomes ready (stdout keeps the summary)."""
    now = time.monotonic()
    if event == "starting":
        _started[comp.name] = now
        print(f"{comp.name:<13} starting ...", file=sys.stderr, flush=True)
    elif event == "ready":
        took = now - _started.get(comp.name, now)
        print(f"{comp.name:<13} ready after {took:.1f} s", file=sys.stderr, flush=True)
    else:
        print(f"{comp.name:<13} {event}", file=sys.stderr, flush=True)


def status_table(status: dict[str, dict[str, Any]]) -> str:
    """`stack status` for people: one row per component, ports as host:port, the log file."""
    rows = [("COMPONENT", "STATE", "PID", "PORTS", "LOG")]
    for name, s in status.items():
        ports = ", ".join(f"{label} {addr}" for label, addr in s["ports"].items()) or "-"
        rows.append((name, "running" if s["running"] else "stopped", str(s["pid"] or "-"), ports, str(s["log"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        settings = load_settings(a.config)
    except ConfigError as e:
        print(f"opsloop stack: {e}", file=sys.stderr)
        return 2
    stack = Stack(settings.stack)
    try:
        if a.action == "up":
            for comp in stack.up(progress=_progress):
                ports = ", ".join(f"{k} {h}:{p}" for k, (h, p) in comp.ports.items())
                print(f"{comp.name:<13} up   {ports}   log {comp.logfile}")
            print(f"\nKafka {stack.kafka_bootstrap} · Prometheus {stack.prometheus_url} · "
                  f"Alertmanager {stack.alertmanager_url}")
        elif a.action == "down":
            stack.down()
            print("stack stopped")
        else:
            st = stack.status()
            if a.json:
                print(orjson.dumps(st, option=orjson.OPT_INDENT_2).decode())
            else:
                print(status_table(st))
    except StackError as e:
        print(f"opsloop stack: {e}", file=sys.stderr)
        return 1
    return 0
