"""`opsloop stream <subcommand>`: the stream processing stage."""

from __future__ import annotations

import argparse

from opsloop.subcommands import Subcommands, build_dispatcher, dispatch

SUBCOMMANDS: Subcommands = {
    "worker": ("opsloop.streams.worker:main", "the Faust worker running every stream agent (/metrics on loopback)"),
}

EPILOG = """examples:
  opsloop stream worker --config opsloop.yaml
  opsloop stream worker --help
"""


def build_parser() -> argparse.ArgumentParser:
    return build_dispatcher("opsloop stream", __doc__, EPILOG, SUBCOMMANDS)


def main(argv: list[str] | None = None) -> int:
    return dispatch("opsloop stream", build_parser, SUBCOMMANDS, argv)
