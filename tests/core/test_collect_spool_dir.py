"""`opsloop collect` with a spool directory that cannot be created: one line naming the setting, exit 78
(EX_CONFIG: systemd does not restart it, the setting must change).

The spool is where rounds wait while the broker is away; a collector started without one would lose
them, so it refuses to start, and says why instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli, write_config


def test_a_spool_dir_below_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    config = write_config(tmp_path / "opsloop.yaml", {
        "kafka": {"bootstrap_servers": "127.0.0.1:1"},
        "collector": {"spool_dir": str(blocker / "spool"), "metrics_port": 0},
        "collectors": {"haproxy": {"instances": {"e1": str(tmp_path / "admin.sock")}}}})
    r = run_cli("collect", "haproxy", "--config", str(config), timeout=60)
    assert r.returncode == 78, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    line = [x for x in r.stderr.splitlines() if "collector.spool_dir" in x]
    assert line and str(blocker / "spool" / "haproxy") in line[0] and "Not a directory" in line[0], r.stderr[-2000:]
