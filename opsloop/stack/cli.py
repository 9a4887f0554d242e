"""`opsloop stack up|down|status`: the local real stack, on loopback ports from the config."""

from __future__ import annotations

import argparse
import sys

import orjson

from opsloop.config import ConfigError, load_settings
from opsloop.stack.manager import Stack
from opsloop.stack.process import StackError

EPILOG = """examples:
  opsloop stack up                       # default ports: Kafka 29092, Prometheus 29090, Alertmanager 29094
  opsloop stack up --config opsloop.yaml
  opsloop stack status --json
  opsloop stack down                     # stops each component by its PID
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="opsloop stack", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--config", help="opsloop YAML config (the `stack` section)")
    p.add_argument("--json", action="store_true", help="status as JSON")
    a = p.parse_args(argv)
    try:
        settings = load_settings(a.config)
    except ConfigError as e:
        print(f"opsloop stack: {e}", file=sys.stderr)
        return 2
    stack = Stack(settings.stack)
    try:
        if a.action == "up":
            for comp in stack.up():
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
                for name, s in st.items():
                    print(f"{name:<13} {'running' if s['running'] else 'stopped':<8} pid {s['pid'] or '-':<8} "
                          f"{s['ports']}")
    except StackError as e:
        print(f"opsloop stack: {e}", file=sys.stderr)
        return 1
    return 0
