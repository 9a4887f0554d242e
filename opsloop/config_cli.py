"""`opsloop config check|defaults`: validate the one config file (every section) or print every default."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from opsloop.config import CONFIG_ENV, DEFAULT_CONFIG_PATH, ConfigError, defaults_document, load_settings
from opsloop.redact import redact_credentials

EPILOG = f"""examples:
  opsloop config check opsloop.yaml          # every error on its own line, with its path; exit 2 if any
  opsloop config check                       # ${CONFIG_ENV}, else {DEFAULT_CONFIG_PATH}
  opsloop config defaults > opsloop.yaml     # every setting with its default (required ones are null)
  OPSLOOP__CONTROLLERS__PAGING__RESEND_INTERVAL_S=30 opsloop config check opsloop.yaml
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsloop config", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="validate FILE and print the effective settings", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("file", nargs="?", help=f"config file (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG_PATH})")
    sub.add_parser("defaults", help="print every setting with its default, as YAML", epilog=EPILOG,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.cmd == "defaults":
        print(yaml.safe_dump(defaults_document(), sort_keys=False), end="")
        return 0
    try:
        settings = load_settings(a.file)
    except ConfigError as e:
        print(f"opsloop config: {e}", file=sys.stderr)
        return 2
    # URLs may carry user:password@ (Alertmanager, Elasticsearch); the output goes to terminals and CI logs.
    print(yaml.safe_dump(_redacted(settings.model_dump(mode="json")), sort_keys=False), end="")
    return 0


def _redacted(value: Any) -> Any:
    """``value`` with the credentials of every URL in its strings masked (keys and structure kept)."""
    if isinstance(value, str):
        return redact_credentials(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value
