"""A tool that leaves a process behind in a session of its own (``setsid``: a wrapper script starting a
helper, a tool that daemonizes) holding our stdout. On timeout the tool's process group is killed, but
that process is not in it, and both runners then read the pipes to their end without a deadline: the
round (the LVS, iptables and IPMI collectors) hung for as long as the orphan lived. The netperf runner
already gave the pipes a grace period; the other two now do too."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from opsloop.collect.tool import ToolTimeout, run_tool
from opsloop.collectors.ipmi.runner import run_tool as run_ipmitool
from tests.trickle import ends_within


@pytest.fixture
def orphan(tmp_path: Path) -> Iterator[list[str]]:
    """argv of a tool that starts a setsid'ed sleeper on our stdout, writes its pid, then hangs."""
    pidfile = tmp_path / "orphan.pid"
    yield ["sh", "-c", f"setsid sleep 300 & echo $! > {pidfile}; sleep 300"]
    if pidfile.exists():   # the orphan is ours: stop it by its pid
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def test_collect_tool_timeout_ends_despite_an_orphan_holding_the_pipes(orphan: list[str]) -> None:
    with pytest.raises(ToolTimeout, match="did not finish within 0.5s"):
        ends_within(lambda: run_tool(orphan, timeout_s=0.5))


def test_ipmitool_runner_timeout_ends_despite_an_orphan_holding_the_pipes(orphan: list[str]) -> None:
    result = ends_within(lambda: run_ipmitool(orphan, timeout_s=0.5))
    assert result.timed_out and result.returncode is None
