"""Every command that takes ``--config``, found by walking the argparse tree, given a config file it cannot
use: exit 2 (a long-running service 78, EX_CONFIG, as for its other configuration errors) with one line naming
the file, no traceback, and nothing of the file's text (a secret with a stray quote was printed whole: PyYAML's
message quotes the offending line under a caret)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from opsloop import exitcodes
from opsloop.cli import COMMANDS, TAKE_CONFIG, build_parser
from tests.helpers import REPO, run_cli

SECRET = "s3cr3t-in-the-file"
BAD_FILES: dict[str, str | bytes | None] = {
    "missing": None,
    "unclosed quote": f'kafka:\n  sasl_password: "{SECRET}\n  sasl_username: me\n',
    "unclosed list": f"kafka:\n  sasl_password: [{SECRET}\n",
    "not a mapping": f"- {SECRET}\n",
    # a latin-1 comment (or a UTF-16 file from another editor): a UnicodeDecodeError traceback in every command
    "not UTF-8": f"# r\xe9seau\nkafka:\n  security: {{password: {SECRET}}}\n".encode("latin-1"),
}


def _leaves(path: list[str], parser: argparse.ArgumentParser) -> list[tuple[list[str], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    return [leaf for a in subs for name, sub in a.choices.items() for leaf in _leaves([*path, name], sub)]


def _argv(path: list[str], parser: argparse.ArgumentParser) -> list[str] | None:
    """The command with its required arguments filled in, or None if it takes no --config."""
    argv = list(path)
    if not any("--config" in a.option_strings for a in parser._actions):
        return None
    for a in parser._actions:
        if a.option_strings and a.required:
            argv += [a.option_strings[-1], "x"]
        elif not a.option_strings and a.nargs not in ("?", "*", argparse.REMAINDER):
            argv.append(str(next(iter(a.choices))) if a.choices else "x")
    return argv


COMMANDS_WITH_CONFIG = [argv for name in COMMANDS for path, p in _leaves([name], build_parser(name))
                        if (argv := _argv(path, p)) is not None]


def test_the_walk_finds_the_services() -> None:
    found = {" ".join((a.values[0] if hasattr(a, "values") else a)[:2]) for a in COMMANDS_WITH_CONFIG}
    assert {"stream worker", "page run", "weights run", "edge run"} <= found, found


def test_the_commands_checked_up_front_are_those_with_a_config_option() -> None:
    assert TAKE_CONFIG == {argv[0] for argv in COMMANDS_WITH_CONFIG}


@pytest.mark.parametrize("case", BAD_FILES)
@pytest.mark.parametrize("argv", COMMANDS_WITH_CONFIG, ids=" ".join)
def test_a_bad_config_file_is_one_line_and_exit_2_or_78(argv: list[str], case: str, tmp_path: Path) -> None:
    cfg = tmp_path / "opsloop.yaml"
    text = BAD_FILES[case]
    if isinstance(text, bytes):
        cfg.write_bytes(text)
    elif text is not None:
        cfg.write_text(text)
    r = run_cli(*argv, "--config", str(cfg), timeout=60)
    lines = r.stderr.strip().splitlines()
    service = argv[0] == "collect" or argv[:2] in (["stream", "worker"], ["edge", "run"], ["weights", "run"],
                                                   ["page", "run"])
    assert r.returncode == (exitcodes.CONFIG if service else 2), f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert str(cfg) in lines[0], lines[0]
    assert SECRET not in r.stderr + r.stdout, lines[0]


def test_a_secret_setting_with_a_bad_value_is_named_not_shown(tmp_path: Path) -> None:
    # YAML reads an all-digit password as an int; a secret put where its variable's name goes: both
    # failed validation and were printed whole after "got".
    digits = "98765432101"
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text(f"""
kafka:
  security: {{protocol: SASL_SSL, sasl_mechanism: PLAIN, username: u, password: {digits}}}
audit:
  elasticsearch: {{username: u, password: [{SECRET}], api_key: {digits}}}
collectors:
  ipmi:
    hosts: [{{name: a, bmc: x, password_env: "{SECRET}!"}}]
""")
    r = run_cli("config", "check", str(cfg))
    assert r.returncode == 2, r.stderr
    for path in ("kafka.security.password", "audit.elasticsearch.password", "audit.elasticsearch.api_key",
                 "collectors.ipmi.hosts.0.password_env"):
        assert f"  {path}: " in r.stderr, (path, r.stderr)
    assert digits not in r.stderr and SECRET not in r.stderr, r.stderr
    assert "value not shown" in r.stderr


def test_an_unreadable_file_is_refused_before_the_command_is_imported(tmp_path: Path) -> None:
    # the edge service's import (SciPy, the Elasticsearch and Kafka clients) took seconds before a
    # typo in the path was reported; the file is read first, the module only after
    probe = ("import sys; from opsloop.cli import main; rc = main(sys.argv[1:]); "
             "print(rc, 'opsloop.controllers.edge.service.app' in sys.modules, 'scipy' in sys.modules)")
    missing = str(tmp_path / "typo.yaml")
    r = subprocess.run([sys.executable, "-c", probe, "edge", "run", "--config", missing],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.stdout.split() == ["78", "False", "False"], r.stdout + r.stderr   # a service: EX_CONFIG
    assert r.stderr.strip() == f"opsloop edge run: config file {missing}: cannot read (No such file or directory)"
    # a readable file: the command is imported and validates it (its own message; the service's 78, EX_CONFIG)
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text("controllers:\n  edge: {interval_s: -1}\n")
    r = subprocess.run([sys.executable, "-c", probe, "edge", "run", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.stdout.split()[:2] == ["78", "True"], r.stdout + r.stderr
    assert "interval_s" in r.stderr, r.stderr
    # a pipe is read once, by the command (the check read it empty for the command when it read it first)
    r = subprocess.run([sys.executable, "-c", probe, "edge", "run", "--config", "/dev/stdin"], input=cfg.read_text(),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.stdout.split()[:2] == ["78", "True"] and "interval_s" in r.stderr, r.stdout + r.stderr


def test_state_dir_still_applies_after_the_check(tmp_path: Path) -> None:
    # opsloop.config computes its state-directory defaults when imported: importing it with the
    # dispatcher (for the check) fixed them before `--state-dir` was read, and the option did nothing
    r = run_cli("--state-dir", str(tmp_path), "config", "defaults")
    assert r.returncode == 0, r.stderr
    assert f"data_dir: {tmp_path / 'streams'}" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-c", "import sys, opsloop.cli; print('opsloop.config' in sys.modules)"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.stdout.strip() == "False", r.stdout + r.stderr
