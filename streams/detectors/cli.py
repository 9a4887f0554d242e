"""`opsloop detect <subcommand>`: offline tools for the stream detectors."""

from __future__ import annotations

import sys

USAGE = """usage: opsloop detect {replay,evaluate} ...

  replay    run the streaming detector over a timestamp,value CSV; one score in [0,1] per row
  evaluate  backtest the detector on labelled history: window score (three cost profiles),
            precision, recall and delay per event, optional --plot PNG

examples:
  opsloop detect replay --input series.csv --output scores.csv
  cat series.csv | opsloop detect replay > scores.csv
  opsloop detect evaluate --input incident.csv --plot incident.png
  opsloop detect evaluate --input a.csv --input b.csv --windows windows.csv --set refractory=50"""


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] == "replay":
        from streams.detectors.replay_cli import main as replay_main

        return replay_main(argv[1:])
    if argv[0] == "evaluate":
        from streams.detectors.evaluate_cli import main as evaluate_main

        return evaluate_main(argv[1:])
    print(f"opsloop detect: unknown subcommand {argv[0]!r} (try: replay, evaluate)", file=sys.stderr)
    return 2
