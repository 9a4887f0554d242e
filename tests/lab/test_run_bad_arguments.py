"""`opsloop run` refusing what it cannot use before anything is started: a --run-dir that cannot be created
(a file in its path: was a FileNotFoundError/NotADirectoryError traceback), one line naming it, exit 2; nan,
inf or negative numbers for its rate, duration and restart budget (argparse's error, exit 2; a nan traffic
rate made the lab generator send as fast as it could)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_cli


def test_a_run_dir_that_cannot_be_created_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text("{}\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    run_dir = a_file / "pipeline"
    r = run_cli("run", "--config", str(cfg), "--run-dir", str(run_dir), "--free-ports", timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"opsloop run: --run-dir {run_dir}: cannot write ") and "Not a directory" in lines[0]


@pytest.mark.parametrize(("arg", "value", "expected"), [
    ("--traffic-rate", "nan", "expected a finite number >= 0, got nan"),
    ("--traffic-rate", "inf", "expected a finite number >= 0, got inf"),
    ("--duration", "-1", "expected a finite number >= 0, got -1"),
    ("--max-restarts", "-2", "expected an integer >= 0, got -2"),
    ("--restart-window", "0", "expected a finite number > 0, got 0"),
])
def test_numbers_it_cannot_use_are_refused(arg: str, value: str, expected: str, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    r = run_cli("run", arg, value, "--run-dir", str(a_file / "pipeline"), "--free-ports", timeout=60)
    assert r.returncode == 2 and f"opsloop run: error: argument {arg}: {expected}" in r.stderr, r.stderr[-2000:]
