"""LVS rates are computed over the interval between two reads of the same source: a slow or hung ipvsadm
later in the round does not stretch the interval of counters read before it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from opsloop.collect.tool import ToolResult
from opsloop.collectors.lvs import Config
from opsloop.collectors.lvs import collector as lvs_collector
from opsloop.collectors.lvs.collector import LvsCollector
from opsloop.lb.ipvs import RealKey, ServiceKey, parse_ipvsadm
from tests.helpers import REPO

TESTDATA = REPO / "collectors" / "lvs" / "testdata"
STATS = [TESTDATA / f"ipvsadm_stats_exact.t{t}.txt" for t in (0, 1)]
MYSQL, REAL = ServiceKey("tcp", "192.168.0.22", 3306), RealKey("192.168.82.22", 3306)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _find(metrics, name, **tags):  # type: ignore[no-untyped-def]
    [hit] = [m for m in metrics if m.name == name and all(m.tags.get(k) == v for k, v in tags.items())]
    return hit


@pytest.mark.parametrize("slow", ["rate", "stats"])
def test_a_slow_ipvsadm_does_not_stretch_the_interval_of_counters_read_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: str) -> None:
    live_stats, live_proc = tmp_path / "ipvsadm_stats.txt", tmp_path / "ip_vs_stats"
    shutil.copy(STATS[0], live_stats)
    proc_text = (TESTDATA / "proc_net_ip_vs_stats.txt").read_text()
    live_proc.write_text(proc_text)
    rate_cmd = ["cat", str(TESTDATA / "ipvsadm_rate_exact.txt")]
    stats_cmd = ["cat", str(live_stats)]
    clock = FakeClock()
    slow_now: list[bool] = [False]
    real_run_tool = lvs_collector.run_tool

    def timed_run_tool(argv: list[str], timeout_s: float) -> ToolResult:
        res = real_run_tool(argv, timeout_s)
        if slow_now[0] and argv == (rate_cmd if slow == "rate" else stats_cmd):
            clock.now += 5.0   # this ipvsadm took 5 s (a loaded host, its timeout_s)
        return res

    monkeypatch.setattr(lvs_collector, "run_tool", timed_run_tool)
    coll = LvsCollector(Config.model_validate({
        "host": "edge-ams-1", "proc_ip_vs": str(TESTDATA / "proc_net_ip_vs.txt"), "proc_ip_vs_stats": str(live_proc),
        "ipvsadm_stats_command": stats_cmd, "ipvsadm_rate_command": rate_cmd}), clock=clock)
    assert coll.collect().errors == []

    clock.now += 15   # the next round starts 15 s later; one ipvsadm of it is slow
    shutil.copy(STATS[1], live_stats)
    live_proc.write_text(proc_text.replace(" 16AA370 ", f" {0x16AA370 + 1500:X} "))
    slow_now[0] = True
    rnd = coll.collect()
    assert rnd.errors == []
    # /proc/net/ip_vs_stats is read first: 15 s between its two reads, whichever ipvsadm was slow
    assert _find(rnd.metrics, "ipvs_totals").fields["connections_rate"] == pytest.approx(1500 / 15)
    before = {(r.service, r.real): r.values for r in parse_ipvsadm(STATS[0].read_text()).rows}
    after = {(r.service, r.real): r.values for r in parse_ipvsadm(STATS[1].read_text()).rows}
    # the stats listing: 15 s after the rate command's slowness (read before it), 20 s after its own
    interval = 15 + (5 if slow == "stats" else 0)
    rs = _find(rnd.metrics, "ipvs_real_server", address="192.168.82.22", virtual_address="192.168.0.22")
    expected = (after[(MYSQL, REAL)]["connections"] - before[(MYSQL, REAL)]["connections"]) / interval
    assert rs.fields["connections_rate"] == pytest.approx(expected)
