"""A reader of opsloop's stdout that exits early (`| head`): opsloop ends quietly with 141, no traceback."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO

SCENARIO = REPO / "controllers" / "edge" / "scenarios" / "demand_surge.yaml"


def test_sim_json_into_a_reader_that_exits_early() -> None:
    # The --json document is one line of ~140 kB: more than a pipe holds, so the writer meets the closed pipe.
    p = subprocess.Popen([sys.executable, "-m", "opsloop.cli", "sim", "--scenario", str(SCENARIO), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.read(100).startswith(b'{"scenario"')
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141
    assert err == ""   # was: a BrokenPipeError traceback

