"""Every command's and sub-command's ``--help``, found by walking the argparse tree (never listed by hand):
exit 0, an examples part, and no reference to issues, work items or documents outside the repository."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from opsloop import __version__
from opsloop.cli import COMMANDS, build_parser, main
from tests.helpers import REPO, run_cli

# What a help text must not cite: issue numbers, work items, the old baseline's name, documents that are
# not in the repository (an .md path named in a help must exist, checked separately).
FORBIDDEN = {
    "an issue": re.compile(r"\bissues?\s*#?\d+", re.I),
    "a ticket number": re.compile(r"(?<![\w&/])#\d+\b"),
    "a work item": re.compile(r"\bitems?\s+\d+", re.I),
    "the word seed": re.compile(r"seed", re.I),
    "DESIGN.md": re.compile(r"DESIGN\.md"),
    "a shared folder outside the repository": re.compile(r"\.\./shared|/work/shared"),
}
MD_PATH = re.compile(r"[\w./-]+\.md\b")


def _walk(path: list[str], parser: argparse.ArgumentParser) -> Iterator[list[str]]:
    yield path
    for action in parser._actions:  # the sub-command actions are only reachable this way
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk([*path, name], sub)


def command_paths() -> list[list[str]]:
    paths: list[list[str]] = [[]]  # `opsloop --help` itself
    for name in COMMANDS:
        paths += _walk([name], build_parser(name))
    return paths


PATHS = command_paths()


def test_the_walk_reaches_nested_sub_commands() -> None:
    # the tree goes below the first level (a walk that stopped there would check too little)
    assert ["detect", "replay"] in PATHS and ["stream", "worker"] in PATHS and ["weights", "rollback"] in PATHS
    assert all([name] in PATHS for name in COMMANDS)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "opsloop")
def test_help(path: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main([*path, "--help"])
    except SystemExit as e:  # argparse's --help
        code = e.code
    out = capsys.readouterr().out
    assert code in (0, None), f"opsloop {' '.join(path)} --help exited {code}"
    assert re.search(r"^examples:", out, re.M | re.I), f"no examples in opsloop {' '.join(path)} --help"
    for what, pattern in FORBIDDEN.items():
        hit = pattern.search(out)
        assert hit is None, f"opsloop {' '.join(path)} --help names {what}: {hit.group(0)!r}"
    for doc in MD_PATH.findall(out):
        assert (REPO / doc).is_file(), f"opsloop {' '.join(path)} --help names {doc}, not a file of the repository"


def test_version_is_in_the_help_and_works() -> None:
    r = run_cli("--help")
    assert r.returncode == 0 and "--version" in r.stdout
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == __version__


def test_the_forbidden_patterns_catch_what_they_should() -> None:
    # guards the guard: each pattern matches the kind of text it is meant to keep out
    samples = {"an issue": "the service (issue 7)", "a ticket number": "see #12", "a work item": "item 3",
               "the word seed": "ours vs the seed's damping", "DESIGN.md": "see DESIGN.md §4",
               "a shared folder outside the repository": "../shared/notes"}
    for what, text in samples.items():
        assert FORBIDDEN[what].search(text), what
    assert not FORBIDDEN["a ticket number"].search("curl http://h/#/alerts &#39;")
