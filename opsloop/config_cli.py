"""`opsloop config check FILE`: validate the one config file and print the effective settings."""

from __future__ import annotations

import argparse
import sys

import yaml

from opsloop.config import ConfigError, load_settings

EPILOG = """examples:
  opsloop config check opsloop.yaml
  opsloop config defaults > opsloop.yaml     # every setting with its default
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="opsloop config", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="validate FILE")
    c.add_argument("file")
    sub.add_parser("defaults", help="print the defaults as YAML")
    a = p.parse_args(argv)
    try:
        settings = load_settings(a.file if a.cmd == "check" else None)
    except ConfigError as e:
        print(f"opsloop config: {e}", file=sys.stderr)
        return 2
    print(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False), end="")
    return 0
