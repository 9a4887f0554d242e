"""The stack manager's clear errors and PID discipline; the one config file's validation; the CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from opsloop.config import ConfigError, StackSettings, load_settings
from opsloop.stack import ManagedProcess, Stack, StackError, free_port
from opsloop.stack.process import require_binary
from tests.helpers import run_cli, write_config


def test_taken_port_is_one_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = ManagedProcess(name="thing", argv=["sleep", "60"], workdir=tmp_path, ports={"web": ("127.0.0.1", port)})
        with pytest.raises(StackError, match=rf"thing: web port 127.0.0.1:{port} is already in use.*config"):
            proc.start()
    assert not proc.running()


def test_free_ports_stay_in_the_range_the_environment_gives(monkeypatch) -> None:
    # the test suite's parallel workers each pick from their own slice (tests/conftest.py)
    monkeypatch.setenv("OPSLOOP_FREE_PORT_RANGE", "20000-20050")
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20 and all(20000 <= p < 20050 for p in ports)
    for bad, why in [("20000", "expected LO-HI"), ("x-y", "expected LO-HI"), ("30000-20000", "LO < HI"),
                     ("28000-30000", "no port below the ephemeral range")]:
        monkeypatch.setenv("OPSLOOP_FREE_PORT_RANGE", bad)
        with pytest.raises(StackError, match=rf"OPSLOOP_FREE_PORT_RANGE={bad!r}: .*{why}"):
            free_port()


def test_missing_binary_names_it_and_what_to_do() -> None:
    with pytest.raises(StackError, match="no-such-binary-xyz: binary not found on PATH; run `make setup`"):
        require_binary("no-such-binary-xyz")


def test_stop_is_by_pid_and_leaves_a_reused_pid_alone(tmp_path: Path) -> None:
    proc = ManagedProcess(name="sleeper", argv=["sleep", "60"], workdir=tmp_path)
    proc.start()
    pid, start_time = proc.read_pid()  # type: ignore[misc]
    assert proc.running()
    proc.stop()
    assert not proc.running() and not proc.pidfile.exists()
    # A stale pidfile naming a live process with another start time (a reused PID) is not killed.
    other = subprocess.Popen(["sleep", "60"])
    try:
        proc.pidfile.write_bytes(orjson.dumps({"pid": other.pid, "start_time": "1"}))
        proc.stop()
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_exit_during_start_up_shows_the_log(tmp_path: Path) -> None:
    proc = ManagedProcess(name="crasher", argv=[sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
                          workdir=tmp_path, ready=lambda: False, ready_timeout_s=20)
    with pytest.raises(StackError, match=r"(?s)crasher: exited with code 3 during start-up.*boom"):
        proc.start()


def test_config_errors_name_section_field_and_value(tmp_path: Path) -> None:
    bad = write_config(tmp_path / "c.yaml", {"stack": {"kafka_port": 70000}})
    with pytest.raises(ConfigError, match=r"stack.kafka_port.*70000"):
        load_settings(bad)
    with pytest.raises(ConfigError, match=r"unknown collector 'nope'"):
        load_settings(write_config(tmp_path / "d.yaml", {"collectors": {"nope": {}}}))
    with pytest.raises(ConfigError, match=r"haproxy\.timeout_s"):
        load_settings(write_config(tmp_path / "e.yaml", {"collectors": {"haproxy": {"timeout_s": -1}}}))
    with pytest.raises(ConfigError, match="typo_section"):
        load_settings(write_config(tmp_path / "f.yaml", {"typo_section": {}}))
    (tmp_path / "g.yaml").write_text("kafka: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(tmp_path / "g.yaml")
    assert load_settings(None).stack.bind == "127.0.0.1"  # loopback by default


def test_cli_help_lists_commands_with_examples() -> None:
    r = run_cli("--help")
    assert r.returncode == 0
    for cmd in ("stack", "run", "collect", "stream", "detect", "sim", "weights", "page", "edge", "audit", "config"):
        assert f"  {cmd} " in r.stdout
    assert "examples:" in r.stdout
    for cmd in (["stack", "--help"], ["collect", "--help"], ["config", "--help"], ["run", "--help"]):
        r = run_cli(*cmd)
        assert r.returncode == 0 and "examples:" in r.stdout, cmd
    r = run_cli("nope")
    assert r.returncode == 2 and "unknown command 'nope'" in r.stderr


def test_config_check_cli(tmp_path: Path) -> None:
    good = write_config(tmp_path / "ok.yaml", {"collector": {"interval_s": 3}})
    r = run_cli("config", "check", str(good))
    assert r.returncode == 0 and "interval_s: 3.0" in r.stdout
    r = run_cli("config", "check", str(write_config(tmp_path / "bad.yaml", {"collector": {"interval_s": "x"}})))
    assert r.returncode == 2 and "collector.interval_s" in r.stderr and "'x'" in r.stderr


@pytest.mark.integration
def test_stack_cli_up_status_down(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "opsloop.yaml", {"stack": {
        "data_dir": str(tmp_path / "stack"), "kafka_port": free_port(), "kafka_controller_port": free_port(),
        "prometheus_port": free_port(), "alertmanager_port": free_port(), "scrape_targets": []}})
    try:
        r = run_cli("stack", "up", "--config", str(cfg), timeout=180)
        assert r.returncode == 0, r.stderr
        assert "kafka" in r.stdout and "prometheus" in r.stdout and "alertmanager" in r.stdout
        st = orjson.loads(run_cli("stack", "status", "--json", "--config", str(cfg)).stdout)
        assert all(v["running"] for v in st.values()) and len(st) == 3
        pids = [v["pid"] for v in st.values()]
        # Starting again while running is a no-op, not a port error.
        assert run_cli("stack", "up", "--config", str(cfg), timeout=180).returncode == 0
    finally:
        r = run_cli("stack", "down", "--config", str(cfg), timeout=120)
    assert r.returncode == 0
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    st = orjson.loads(run_cli("stack", "status", "--json", "--config", str(cfg)).stdout)
    assert not any(v["running"] for v in st.values())


def test_stack_settings_default_to_loopback() -> None:
    st = Stack(StackSettings())
    assert st.kafka_bootstrap.startswith("127.0.0.1:") and st.prometheus_url.startswith("http://127.0.0.1:")


def test_kafka_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xf8.. encodes to "-..." in url-safe base64; kafka-storage would read it as an option.
    import uuid

    from opsloop.stack import components

    ids = iter([uuid.UUID(bytes=b"\xf8" + b"\x00" * 15), uuid.UUID(bytes=b"\x01" * 16)])
    monkeypatch.setattr(components.uuid, "uuid4", lambda: next(ids))
    cid = components._kafka_cluster_id()
    assert not cid.startswith("-")
    assert len(cid) == 22
    assert cid == "AQEBAQEBAQEBAQEBAQEBAQ"
