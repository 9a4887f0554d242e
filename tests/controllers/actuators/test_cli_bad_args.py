"""`opsloop weights apply|rollback` with arguments it cannot use, refused before the LB is touched (no
HAProxy needed: the target's socket does not exist): one line naming the argument, exit 2. Before: shares not
summing to 1 printed pydantic's four-line message, an origin given twice silently took the later share, and
`rollback --to` with a 26-digit version broke every JSON log line of the run (a logging traceback each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_cli, write_config


@pytest.fixture
def config(tmp_path: Path) -> str:
    return str(write_config(tmp_path / "opsloop.yaml", {"controllers": {"actuator": {
        "store_dir": str(tmp_path / "store"),
        "targets": [{"edge": "e1", "listener": "web", "kind": "haproxy", "socket": str(tmp_path / "none.sock"),
                     "backend": "be", "servers": {"near": "near", "far": "far"}}]}}}))


@pytest.mark.parametrize(("weights", "line"), [
    ("near=0.3,far=0.3", "opsloop weights apply: weights: shares must sum to 1, got 0.6 for {'near': 0.3, 'far': 0.3}"),
    ("near=0.5,near=0.5", "opsloop weights apply: --weights: 'near' given twice"),
])
def test_bad_shares_are_one_line(config: str, weights: str, line: str) -> None:
    r = run_cli("weights", "apply", "--config", config, "--edge", "e1", "--weights", weights, "--dry-run")
    assert r.returncode == 2 and r.stderr.strip() == line, r.stderr[-2000:]


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_a_history_limit_below_one_is_refused(config: str, limit: str) -> None:
    # a slice [-limit:]: 0 showed every entry, -3 all but the first three
    r = run_cli("weights", "history", "--config", config, "--edge", "e1", "--limit", limit)
    assert r.returncode == 2 and f"argument --limit: expected an integer >= 1, got {limit}" in r.stderr, r.stderr


@pytest.mark.parametrize("to", ["99999999999999999999999999", "-5"])
def test_a_rollback_version_out_of_range_is_refused(config: str, to: str) -> None:
    r = run_cli("weights", "rollback", "--config", config, "--edge", "e1", "--to", to, "--dry-run")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "Logging error" not in r.stderr, r.stderr[-2000:]
    want = "0 to 9223372036854775807" if to.isdigit() else ">= 0"
    assert f"argument --to: expected a version {want}, got {to}" in r.stderr
