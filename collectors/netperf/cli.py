"""Run the throughput collector by hand: validate a config, measure once, print JSON lines.

The runtime (``opsloop collect netperf``) is the way to run it on an interval and publish to Kafka;
this command is for trying a target set out on the console.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson
from pydantic import ValidationError

from opsloop.collect.types import CollectorUnavailable
from opsloop.config import ConfigError, read_document
from opsloop.validation import describe_validation_error

from opsloop.collectors.netperf.collector import NetperfCollector
from opsloop.collectors.netperf.config import Config

EPILOG = """\
examples:
  # validate the collectors.netperf section of a config file
  python -m opsloop.collectors.netperf --config opsloop.yaml --check
  # measure every target set once; samples and errors as JSON lines on stdout
  python -m opsloop.collectors.netperf --config collectors/netperf/sample.yaml
  # the same through the runtime, publishing to Kafka on an interval
  opsloop collect netperf --config opsloop.yaml

exit status: 0 all targets measured, 1 some target failed, 2 bad config or tool missing
"""


def load_section(path: Path) -> dict:
    """The ``collectors.netperf`` section of a config file (or a file holding only that section)."""
    doc = read_document(path)  # one line naming line and column, never PyYAML's quote of the file's text
    if "collectors" in doc:
        collectors = doc.get("collectors") or {}
        # `collectors: [netperf]` ended in a traceback and exit status 1 (which says "a target failed")
        section = collectors.get("netperf") if isinstance(collectors, dict) else None
        if not isinstance(section, dict):
            raise ValueError("no collectors.netperf section")  # main() names the file
        return section
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opsloop.collectors.netperf", description=__doc__.split("\n")[0],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="YAML file with a collectors.netperf section")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    args = parser.parse_args(argv)
    try:
        config = Config.model_validate(load_section(args.config))
    except ValidationError as e:
        print(f"{args.config}: collectors.netperf: {describe_validation_error(e)}", file=sys.stderr)
        return 2
    except ConfigError as e:  # it names the file
        print(e, file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"{args.config}: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: ok ({len(config.target_sets)} target sets)")
        return 0
    try:
        rnd = NetperfCollector(config).collect()
    except CollectorUnavailable as e:
        print(f"netperf collector unavailable: {e}", file=sys.stderr)
        return 2
    for m in rnd.metrics:
        sys.stdout.write(orjson.dumps(m.to_dict()).decode() + "\n")
    for err in rnd.errors:
        sys.stdout.write(orjson.dumps({"error": {"target": err.target, "kind": err.kind,
                                                 "message": err.message}}).decode() + "\n")
    return 1 if rnd.errors else 0
