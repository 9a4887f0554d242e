"""`opsloop run --run-dir DIR` where DIR cannot be created (a file in its path): exit 2 and one line naming
the directory, before anything is started. Before: a FileNotFoundError/NotADirectoryError traceback."""

from __future__ import annotations

from pathlib import Path

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
