"""`opsloop detect <subcommand>`: offline tools for the stream detectors."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: opsloop detect replay --input series.csv [--output scores.csv]\n\n"
              "  replay   run the streaming detector over a timestamp,value CSV; one score in [0,1] per row\n\n"
              "examples:\n  opsloop detect replay --input series.csv --output scores.csv\n"
              "  cat series.csv | opsloop detect replay > scores.csv")
        return 0
    if argv[0] != "replay":
        print(f"opsloop detect: unknown subcommand {argv[0]!r} (try: replay)", file=sys.stderr)
        return 2
    from streams.detectors.replay_cli import main as replay_main

    return replay_main(argv[1:])
