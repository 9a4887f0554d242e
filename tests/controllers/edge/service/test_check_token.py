"""`opsloop edge check` reads the API token as `opsloop edge run` does: a token file run would refuse
(missing, open to group or others, not UTF-8, empty, short) fails the check, exit 2, one line, the token
never shown. Before: check never read it, and the service failed at start (after Kafka)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.controllers.edge.service.app import main
from opsloop.controllers.edge.service.config import TOKEN_ENV

SECRET = "s3cr3t-in-the-token-file"
TOPOLOGY = """listeners:
  - name: web
    edges: [{name: e1}]
    origins: [{name: near, capacity_rps: 40}]
    latency_ms: {e1: {near: 2}}
"""
CASES: dict[str, tuple[bytes | None, int, str]] = {
    "missing": (None, 0o600, "No such file or directory"),
    "readable by others": (SECRET.encode(), 0o644, "mode 0644 lets group or others read it"),
    "not UTF-8": (f"{SECRET}\xe9".encode("latin-1"), 0o600, f"not UTF-8 text (at byte offset {len(SECRET)})"),
    "empty": (b"\n", 0o600, "missing or shorter than 16 characters"),
    "short": (b"abc\n", 0o600, "missing or shorter than 16 characters"),
}


def _config(tmp_path: Path, token_file: Path) -> Path:
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text(f"controllers:\n  edge:\n    topology_file: {topo}\n    overrides_file: null\n"
                   f"    api: {{token_file: {token_file}}}\n")
    return cfg


@pytest.mark.parametrize("case", CASES)
def test_a_token_file_run_would_refuse_fails_the_check(case: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    content, mode, expected = CASES[case]
    tok = tmp_path / "edge.token"
    if content is not None:
        tok.write_bytes(content)
        tok.chmod(mode)
    assert main(["check", "--config", str(_config(tmp_path, tok))]) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and f"token_file {tok}" in lines[0] and expected in lines[0], out.err
    assert SECRET not in out.err + out.out


def test_a_good_token_file_passes_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    tok = tmp_path / "edge.token"
    tok.write_text(SECRET + "\n")
    tok.chmod(0o600)
    assert main(["check", "--config", str(_config(tmp_path, tok))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: 1 listener(s)") and f"API token file {tok} ok" in out and SECRET not in out


def test_a_short_token_in_the_environment_fails_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "short")
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    assert main(["check", "--topology", str(topo)]) == 2
    assert f"environment variable {TOKEN_ENV} is missing or shorter" in capsys.readouterr().err


def test_skip_token_checks_a_config_away_from_its_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a container's config checked on the host: its token file is a secret mounted in the container only
    assert main(["check", "--config", str(_config(tmp_path, tmp_path / "absent")), "--skip-token"]) == 0
    assert "API token not checked (--skip-token)" in capsys.readouterr().out
