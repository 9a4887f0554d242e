"""A tool that prints without end (a wrapper script in a loop, a broken build, a tool answering garbage) is
killed once its stdout or stderr passes the bound, and the round reports a tool error. Before, both runners
(``opsloop.collect.tool`` for the LVS and iptables collectors, the IPMI runner) kept every byte in memory until
the timeout: at pipe speed several GB for one round of one collector. The bound is lowered here (1 MiB, the
IPMI runner's own) so the flood is short; the tool's pid is read back to show it is gone, not left printing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from opsloop.collect import tool
from opsloop.collectors.ipmi import runner as ipmi_runner
from opsloop.collectors.lvs.collector import LvsCollector
from opsloop.collectors.lvs.config import Config
from tests.helpers import REPO

BOUND = 1024 * 1024
TESTDATA = REPO / "collectors" / "lvs" / "testdata"


def flooder(tmp_path: Path, stream: str = "stdout") -> list[str]:
    """argv of a tool that writes its pid to a file, then prints 64 KiB chunks to ``stream`` for ever
    (a millisecond apart: the old code read until its timeout, and that stays a few hundred MB)."""
    code = (f"import os, sys, time\nopen({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
            f"while True:\n    sys.{stream}.write('x' * 65536); sys.{stream}.flush(); time.sleep(0.001)\n")
    return [sys.executable, "-c", code]


def gone(tmp_path: Path) -> bool:
    try:
        os.kill(int((tmp_path / "pid").read_text()), 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_tool_printing_without_end_is_killed_at_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            stream: str) -> None:
    monkeypatch.setattr(tool, "MAX_OUTPUT_BYTES", BOUND, raising=False)
    with pytest.raises(tool.ToolOutputTooLarge, match=f"printed more than {BOUND} bytes and was killed"):
        tool.run_tool(flooder(tmp_path, stream), timeout_s=30)
    assert gone(tmp_path)


def test_output_up_to_the_bound_is_returned_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tool, "MAX_OUTPUT_BYTES", BOUND, raising=False)
    res = tool.run_tool([sys.executable, "-c", f"import sys; sys.stdout.write('y' * {BOUND}); "
                                               "sys.stderr.write('warn')"], timeout_s=30)
    assert res.returncode == 0 and len(res.stdout) == BOUND and set(res.stdout) == {"y"} and res.stderr == "warn"


def test_the_ipmi_runner_kills_a_flood_and_says_so(tmp_path: Path) -> None:
    res = ipmi_runner.run_tool(flooder(tmp_path), timeout_s=30)
    assert getattr(res, "overflowed", False) and res.returncode is None and not res.timed_out
    assert len(res.stdout) == ipmi_runner.MAX_OUTPUT_BYTES
    assert gone(tmp_path)


def test_the_lvs_collector_reports_a_flooding_ipvsadm_as_a_tool_error(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The round goes on with its other sources (the recorded /proc files) and names the flooding one."""
    monkeypatch.setattr(tool, "MAX_OUTPUT_BYTES", BOUND, raising=False)
    collector = LvsCollector(Config(proc_ip_vs=TESTDATA / "proc_net_ip_vs.txt",
                                    proc_ip_vs_stats=TESTDATA / "proc_net_ip_vs_stats.txt",
                                    ipvsadm_stats_command=flooder(tmp_path), ipvsadm_rate_command=None,
                                    timeout_s=30))
    round_ = collector.collect()
    [error] = round_.errors
    assert error.kind == "tool" and "printed more than" in error.message
    assert round_.metrics   # the /proc sources still read
    assert gone(tmp_path)
