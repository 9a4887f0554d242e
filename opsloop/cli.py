"""The `opsloop` command: one entry point, subcommands implemented next to what they run.

Each subcommand is ``module:function`` taking ``argv`` and returning an exit code; modules are
imported only when their subcommand runs, so `opsloop --help` stays fast and a broken optional
dependency of one stage cannot break the others (a ``--config`` file that cannot be read is refused
before the command's module is imported: exit 2, a service's 78 as for its other configuration errors).
Each of those modules also has ``build_parser()``, its argparse parser (sub-commands included), so tools
and tests can walk every command's help.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import sys
from pathlib import Path

from opsloop import __version__, exitcodes
from opsloop.paths import take_state_dir_option

COMMANDS: dict[str, tuple[str, str]] = {
    "stack": ("opsloop.stack.cli:main", "start/stop/inspect the local real stack (Kafka, Prometheus, Alertmanager)"),
    "run": ("opsloop.lab.pipeline:main", "the whole pipeline on this machine: stack, lab edge, collectors, streams"),
    "collect": ("opsloop.collect.cli:main", "run one collector (collectors/<name>/) on an interval or --once"),
    "stream": ("opsloop.streams.cli:main", "stream processing: `opsloop stream worker`"),
    "detect": ("opsloop.streams.detectors.cli:main", "anomaly detection: `opsloop detect replay`, `opsloop detect evaluate`"),
    "sim": ("opsloop.controllers.edge.sim_cli:main", "closed-loop edge-weight simulator: our controller vs the fixed-step baselines"),
    "edge": ("opsloop.controllers.edge.service.app:main", "edge-weight control service: controller loop + topology API"),
    "weights": ("opsloop.controllers.actuators.cli:main", "edge weights: run the applier, show, history, apply, rollback"),
    "page": ("opsloop.controllers.paging.cli:main", "paging actuator: findings -> Alertmanager alerts (run, render-config)"),
    "audit": ("opsloop.audit.cli:main", "audit trail: why did the weights of edge X change at 03:12?"),
    "logs": ("opsloop.audit.logs_cli:main", "service logs from the journal: `opsloop logs search --unit opsloop-edge`"),
    "deadletter": ("opsloop.deadletter_cli:main", "refused records on the dead-letter topic: list, summary, replay"),
    "config": ("opsloop.config_cli:main", "validate a config file and print the effective settings"),
}

# the commands with a ``--config`` option (the opsloop YAML file); tests walk the parsers to keep it true
TAKE_CONFIG = frozenset({"stack", "run", "collect", "stream", "edge", "weights", "page", "audit", "logs",
                         "deadletter"})
# the long-running services (opsloop/exitcodes.py): a config file they cannot read exits CONFIG (78), as every
# other configuration error of theirs, so systemd stops restarting; None: any subcommand (`collect <name>`)
SERVICES: dict[str, str | None] = {"collect": None, "stream": "worker", "edge": "run", "weights": "run", "page": "run"}

EPILOG = """examples:
  opsloop stack up                      # Kafka, Prometheus, Alertmanager on loopback (ports in the config)
  opsloop run                           # everything, with an HAProxy lab edge and traffic (make run)
  opsloop collect haproxy --once --stdout --config opsloop.yaml
  opsloop stream worker --config opsloop.yaml
  opsloop detect replay --input series.csv --output scores.csv
  opsloop sim --scenario controllers/edge/scenarios/demand_surge.yaml
  opsloop deadletter summary --config opsloop.yaml --since 24h
  opsloop config check opsloop.yaml
  opsloop --version
"""


def usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: opsloop <command> [options]   (opsloop <command> --help for details)",
             "       opsloop --version", "", "commands:"]
    lines += [f"  {n:<{width}}  {h}" for n, (_, h) in COMMANDS.items()]
    lines += ["", "options:", "  -h, --help  show this help and exit", "  --version   print the opsloop version and exit",
              "  --state-dir DIR  (before the command) root of the state directories; default .run/ in a source",
              "                   checkout, else /var/lib/opsloop; also $OPSLOOP_STATE_DIR"]
    return "\n".join(lines) + "\n\n" + EPILOG


def build_parser(name: str) -> argparse.ArgumentParser:
    """The argparse parser of command ``name`` (imports only that command's module)."""
    module = COMMANDS[name][0].split(":")[0]
    return importlib.import_module(module).build_parser()  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0].startswith("--state-dir"):
        # opsloop --state-dir DIR <command>: set before the command's module computes its state defaults.
        try:
            rest = take_state_dir_option(argv)
        except ValueError as e:
            print(f"opsloop: {e}", file=sys.stderr)
            return 2
        return main(rest)
    if argv[0] == "--version":
        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"opsloop: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    bad_config = _unreadable_config(name, rest)
    if bad_config:
        print(bad_config, file=sys.stderr)
        return exitcodes.CONFIG if _is_service(name, rest) else 2
    module, func = COMMANDS[name][0].split(":")
    fn = getattr(importlib.import_module(module), func)
    try:
        try:
            code = int(fn(rest) or 0)
        except SystemExit:   # argparse's --help: its text may still sit in the buffer
            sys.stdout.flush()
            raise
        sys.stdout.flush()   # a reader gone early shows here, not as "Exception ignored" at exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # `opsloop sim --json | head -c 100`: was a traceback
        return _reader_gone()


# only the option: the rest of the command line is the command's (argparse's own reading of
# `--config X`, `--config=X` and `--`, as the command's parser reads them)
_CONFIG_OPTION = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
_CONFIG_OPTION.add_argument("--config")


def _unreadable_config(name: str, rest: list[str]) -> str | None:
    """The one-line error for a ``--config`` file that cannot be read as YAML settings (missing, not
    UTF-8, not YAML, not a mapping), before the command's module is imported: that import (SciPy,
    the Elasticsearch and Kafka clients) took up to 3 s before a typo in the path was reported.
    Validation stays with the command, which merges its own options and the environment first."""
    if name not in TAKE_CONFIG or "-h" in rest or "--help" in rest:
        return None
    try:
        given = _CONFIG_OPTION.parse_known_args(rest)[0].config
    except argparse.ArgumentError:   # `--config` without a file: the command's parser says so
        return None
    # a pipe (`--config <(...)`, /dev/stdin) can be read once: the command's read is that one
    if given is None or (Path(given).exists() and not Path(given).is_file()):
        return None
    # imported here, not at the top: opsloop.config computes its state-directory defaults when it is
    # imported, which must come after `opsloop --state-dir DIR` has set them (and --help stays fast)
    config = importlib.import_module("opsloop.config")
    try:
        config.read_document(Path(given))
    except config.ConfigError as e:
        words = itertools.takewhile(lambda arg: not arg.startswith("-"), rest)   # `weights show`
        return f"opsloop {' '.join([name, *words])}: {e}"
    return None


def _is_service(name: str, rest: list[str]) -> bool:
    """Whether ``opsloop name rest...`` runs a long-running service (its subcommand comes before any option)."""
    if name not in SERVICES:
        return False
    sub = SERVICES[name]
    return sub is None or next((arg for arg in rest if not arg.startswith("-")), None) == sub


def _reader_gone() -> int:
    """The reader of stdout closed the pipe: Python's recipe (docs of `signal`, "Note on SIGPIPE"): stdout
    to /dev/null so the flush at exit stays quiet, and the status a shell gives a command killed by SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):   # stdout without a file descriptor (replaced in-process)
        pass
    return 141


if __name__ == "__main__":
    sys.exit(main())
