"""Every benchmark module alone answers --help with its description and examples, and starts nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO

MODULES = sorted(p.stem for pattern in ("bench_*.py", "sim_*.py") for p in (REPO / "bench").glob(pattern))


def test_the_benchmarks_were_found() -> None:
    assert len(MODULES) >= 10


@pytest.mark.parametrize("name", MODULES)
def test_help_prints_usage_and_examples(name: str) -> None:
    out = subprocess.run([sys.executable, "-m", f"bench.{name}", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:") and "examples:" in out.stdout, out.stdout
