"""`python -m opsloop.collectors.netperf --config FILE` whose ``collectors`` is not a mapping: one line naming
the file, exit 2 (bad config). Before: an AttributeError traceback and exit status 1, which the CLI documents
as "some target failed"; and a file without the section was named twice on its line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO


@pytest.mark.parametrize("content", ["collectors: [netperf]\n", "collectors: netperf\n", "collectors: 3\n",
                                     "collectors:\n  netperf: [a, b]\n", "collectors: {}\n"])
def test_collectors_that_is_not_a_mapping_is_a_bad_config(tmp_path: Path, content: str) -> None:
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text(content)
    r = subprocess.run([sys.executable, "-m", "opsloop.collectors.netperf", "--config", str(cfg), "--check"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == f"{cfg}: no collectors.netperf section"
