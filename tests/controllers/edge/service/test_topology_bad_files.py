"""`opsloop edge check --topology FILE` with a topology file it cannot use: exit 2 and one line naming the
file (and the line and column of a YAML error), never a traceback, nothing of the file's text. Before: a
file not UTF-8 was a UnicodeDecodeError traceback and a YAML error PyYAML's multi-line message quoting the
offending line under a caret. And the API token file not UTF-8: one line, the token not shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.config import ConfigError
from opsloop.controllers.edge.service.config import ApiSettings, read_token
from tests.helpers import run_cli, write_case_file

SECRET = "s3cr3t-in-the-file"
GOOD = """listeners:
  - name: web
    edges: [{name: e1}]
    origins: [{name: near, capacity_rps: 40}]
    latency_ms: {e1: {near: 2}}
"""
CASES: dict[str, tuple[str | bytes | None, str]] = {
    "missing": (None, "cannot read (No such file or directory)"),
    "a directory": ("dir", "cannot read (Is a directory)"),
    "not UTF-8": (f"# r\xe9seau {SECRET}\n{GOOD}".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 3)"),
    "unclosed quote": (f'listeners:\n  - name: "{SECRET}\n    edges: []\n', "not valid YAML: line 4, column 1: found unexpected end of stream (while scanning a quoted scalar from line 2, column 11)"),
    "empty": ("# nothing yet\n", "empty"),
    "not a mapping": (f"- {SECRET}\n", "top level must be a mapping, got list"),
    "a wrong field": (GOOD.replace("capacity_rps: 40", "capacity_rps: -40"),
                      "listeners.0.origins.0.capacity_rps: capacity_rps: expected a finite number >= 0, got -40"),
    "nested too deeply": ("[" * 3000 + "]" * 3000, "nested too deeply"),
    # a check across fields quoted the listener's mapping after "got"
    "a duplicate edge": (GOOD.replace("edges: [{name: e1}]", f"edges: [{{name: e1}}, {{name: e1, lb: {SECRET}}}]"),
                         "listeners.0: edges: duplicate name(s) ['e1'] in listener 'web'"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_topology_file_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    content, expected = CASES[case]
    topo = write_case_file(tmp_path / "topology.yaml", content)
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text("{}\n")
    r = run_cli("edge", "check", "--config", str(cfg), "--topology", str(topo), timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert f"topology file {topo}: " in lines[0] and expected in lines[0], lines[0]
    assert SECRET not in r.stderr + r.stdout, lines[0]


def test_a_good_topology_file_checks(tmp_path: Path) -> None:
    topo, cfg = tmp_path / "topology.yaml", tmp_path / "opsloop.yaml"
    topo.write_text(GOOD)
    cfg.write_text("{}\n")
    r = run_cli("edge", "check", "--config", str(cfg), "--topology", str(topo), timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("ok: 1 listener(s): web (1 edges, 1 origins)"), r.stderr


def test_an_api_token_file_not_utf8_is_one_line_without_the_token(tmp_path: Path) -> None:
    # read at `opsloop edge run` start, after Kafka: a UnicodeDecodeError traceback that printed the bytes
    tok = tmp_path / "token"
    tok.write_bytes(f"{SECRET}-\xe9-{SECRET}\n".encode("latin-1"))
    tok.chmod(0o600)
    with pytest.raises(ConfigError) as e:
        read_token(ApiSettings(token_file=tok))
    assert str(e.value) == (f"controllers.edge.api.token_file {tok}: not UTF-8 text "
                            f"(at byte offset {len(SECRET) + 1})")
