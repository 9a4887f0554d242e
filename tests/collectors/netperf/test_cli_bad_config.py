"""`python -m opsloop.collectors.netperf --config FILE` with a file that is not YAML or not UTF-8: one
line naming the file, exit 2. Before: PyYAML's message over several lines quoting the offending line (a
secret with a stray quote printed whole), and a not-UTF-8 file named only by Python's codec error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

SECRET = "s3cr3t-in-the-file"


@pytest.mark.parametrize("content,says", [
    (f'collectors:\n  netperf:\n    note: "{SECRET}\n'.encode(), "not valid YAML: line 4, column 1"),
    (f"# r\xe9seau {SECRET}\ncollectors: {{}}\n".encode("latin-1"), "not UTF-8 text"),
], ids=["not YAML", "not UTF-8"])
def test_a_bad_file_is_one_line_naming_it(tmp_path: Path, content: bytes, says: str) -> None:
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "opsloop.collectors.netperf", "--config", str(cfg), "--check"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(cfg) in lines[0] and says in lines[0] and SECRET not in r.stderr, lines[0]
