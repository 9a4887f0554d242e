"""`opsloop detect <subcommand>`: offline tools for the stream detectors."""

from __future__ import annotations

import argparse

from opsloop.subcommands import Subcommands, build_dispatcher, dispatch

SUBCOMMANDS: Subcommands = {
    "replay": ("opsloop.streams.detectors.replay_cli:main",
               "run the streaming detector over a timestamp,value CSV; one score in [0,1] per row"),
    "evaluate": ("opsloop.streams.detectors.evaluate_cli:main",
                 "backtest the detector on labelled history: window score (three cost profiles), "
                 "precision, recall and delay per event, optional --plot PNG"),
}

EPILOG = """examples:
  opsloop detect replay --input series.csv --output scores.csv
  cat series.csv | opsloop detect replay > scores.csv
  opsloop detect evaluate --input incident.csv --plot incident.png
  opsloop detect evaluate --input a.csv --input b.csv --windows windows.csv --set refractory=50"""


def build_parser() -> argparse.ArgumentParser:
    return build_dispatcher("opsloop detect", __doc__, EPILOG, SUBCOMMANDS)


def main(argv: list[str] | None = None) -> int:
    return dispatch("opsloop detect", build_parser, SUBCOMMANDS, argv)
