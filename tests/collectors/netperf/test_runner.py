"""The tool runner: hard timeout, the whole process group killed, bounded output and concurrency."""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

import pytest

from opsloop.collectors.netperf.runner import Runner, ToolMissing
from tests.collectors.netperf.lab import processes_with


def test_timeout_kills_the_process_and_everything_it_forked() -> None:
    # A shell that forks a background child and then waits: both must die (unique durations find them).
    n = 300000 + secrets.randbelow(99999)
    done = Runner().run(["sh", "-c", f"sleep {n} & sleep {n + 1}; echo unreachable"], timeout_s=0.5)
    assert done.timed_out and done.returncode is None
    assert "unreachable" not in done.stdout
    assert processes_with(f"sleep {n}") == [] and processes_with(f"sleep {n + 1}") == []


def test_children_left_after_a_normal_exit_are_killed() -> None:
    n = 400000 + secrets.randbelow(99999)
    done = Runner().run(["sh", "-c", f"sleep {n} >/dev/null 2>&1 & echo started"], timeout_s=10)
    assert done.returncode == 0 and not done.timed_out and done.stdout.strip() == "started"
    assert processes_with(f"sleep {n}") == []


def test_output_is_bounded_for_a_tool_that_floods() -> None:
    done = Runner(output_limit=4096).run(["yes", "garbage"], timeout_s=0.3)
    assert done.timed_out
    assert len(done.stdout) == 4096 and done.stdout.startswith("garbage\n")


def test_exit_code_and_both_streams_kept() -> None:
    done = Runner().run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10)
    assert (done.returncode, done.stdout.strip(), done.stderr.strip()) == (3, "out", "err")
    assert done.output == "out\nerr"


def test_missing_tool_raises_tool_missing() -> None:
    with pytest.raises(ToolMissing) as e:
        Runner().run(["/nonexistent/netperf"], timeout_s=1)
    assert "/nonexistent/netperf" in str(e.value)


def test_runs_in_c_locale() -> None:
    done = Runner().run(["sh", "-c", "echo $LC_ALL"], timeout_s=10)
    assert done.stdout.strip() == "C"


def test_concurrency_never_exceeds_the_bound() -> None:
    runner = Runner(max_processes=2)
    threads = [threading.Thread(target=runner.run, args=(["sleep", "0.3"], 10)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runner.peak == 2 and runner.alive == 0


def test_own_session_per_tool() -> None:
    done = Runner().run(["sh", "-c", "ps -o pgid= -p $$; echo $$"], timeout_s=10)
    pgid, pid = done.stdout.split()
    assert pgid == pid and int(pgid) != os.getpgid(0)


def test_a_tool_that_cannot_be_executed_raises_tool_missing(tmp_path: Path) -> None:
    # Executable but no #! line: execve fails with ENOEXEC, an OSError that is neither "missing" nor "denied".
    tool = tmp_path / "netperf"
    tool.write_bytes(b"\x00\x01not a program\n")
    tool.chmod(0o755)
    with pytest.raises(ToolMissing, match="Exec format error"):
        Runner().run([str(tool)], timeout_s=1)
