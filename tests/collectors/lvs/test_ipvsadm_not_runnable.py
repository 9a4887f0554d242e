"""An ipvsadm that exists but cannot be run (an exec format error: a wrapper script without its #! line, a
binary of another architecture): that source's ``tool`` error, the /proc sources still read. Before, run_tool
let the OSError out and the collector lost the whole round, /proc's metrics too."""

from __future__ import annotations

from pathlib import Path

from opsloop.collectors.lvs import Config
from opsloop.collectors.lvs.collector import LvsCollector
from tests.helpers import REPO

TESTDATA = REPO / "collectors" / "lvs" / "testdata"


def test_an_ipvsadm_that_cannot_be_executed_is_one_source_error(tmp_path: Path) -> None:
    wrapper = tmp_path / "ipvsadm"
    wrapper.write_text("exec /usr/sbin/ipvsadm \"$@\"\n")   # executable, but no interpreter line: ENOEXEC
    wrapper.chmod(0o755)
    cfg = Config.model_validate({"host": "edge-ams-1", "proc_ip_vs": str(TESTDATA / "proc_net_ip_vs.txt"),
                                 "proc_ip_vs_stats": str(TESTDATA / "proc_net_ip_vs_stats.txt"),
                                 "ipvsadm_stats_command": [str(wrapper), "-Ln", "--stats", "--exact"],
                                 "ipvsadm_rate_command": None})
    rnd = LvsCollector(cfg).collect()
    assert [(e.kind, e.target) for e in rnd.errors] == [("tool", f"{wrapper} -Ln --stats --exact")]
    assert f"cannot run '{wrapper}': Exec format error" in rnd.errors[0].message
    assert len([m for m in rnd.metrics if m.name == "ipvs_virtual_server"]) == 5   # /proc's services, still read
    assert [m.name for m in rnd.metrics].count("ipvs_totals") == 1
