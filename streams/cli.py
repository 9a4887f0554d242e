"""`opsloop stream <subcommand>`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: opsloop stream worker [--config FILE] [--metrics-port N]\n\n"
              "  worker   the Faust worker running every stream agent (/metrics on loopback)\n\n"
              "examples:\n  opsloop stream worker --config opsloop.yaml")
        return 0
    if argv[0] != "worker":
        print(f"opsloop stream: unknown subcommand {argv[0]!r} (try: worker)", file=sys.stderr)
        return 2
    from streams.worker import main as worker_main

    return worker_main(argv[1:])
