"""`opsloop config check|defaults`: validate the one config file (every section) or print every default."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from opsloop.config import (CONFIG_ENV, DEFAULT_CONFIG_PATH, ConfigError, config_path, defaults_document, load_settings,
                            path_problems)
from opsloop.redact import MASK, redact_credentials
from opsloop.validation import is_secret_setting

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
    # a file setting that names a directory (or a file read at start that is missing) passed, and the service
    # then exited 78 at start: said here, each with its setting (a missing one as a warning)
    p = config_path(a.file)
    errors, missing = path_problems(settings, p.resolve().parent if p is not None else None)
    where = f"config file {p}" if p is not None else "configuration"
    for line in missing:   # a warning: the check may run where the files are not (a CI job)
        print(f"opsloop config: warning: {where}: {redact_credentials(line)}", file=sys.stderr)
    if errors:
        print(f"opsloop config: {where}: {len(errors)} error{'s' if len(errors) > 1 else ''}:\n  "
              + "\n  ".join(redact_credentials(line) for line in errors), file=sys.stderr)
        return 2
    # URLs may carry user:password@ (Alertmanager, Elasticsearch); the output goes to terminals and CI logs.
    # (over the text, as the log formatter does: a URL is one YAML scalar on one line)
    print(redact_credentials(yaml.safe_dump(masked_secrets(settings.model_dump(mode="json")), sort_keys=False)),
          end="")
    return 0


def masked_secrets(value: Any) -> Any:
    """``value`` with every setting named like a secret masked, at any depth. The stage sections are printed as
    given (mappings, not models: no SecretStr), so ``audit.elasticsearch.password`` or ``api_key`` from the file
    or the environment was printed in clear."""
    if isinstance(value, dict):
        return {k: MASK if isinstance(k, str) and is_secret_setting(k) and v is not None else masked_secrets(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [masked_secrets(v) for v in value]
    return value
