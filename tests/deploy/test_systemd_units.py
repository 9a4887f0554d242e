"""deploy/systemd: the units an operator installs, checked with the real `systemd-analyze verify`.

The units name /opt/opsloop/venv/bin/opsloop; the test copies them and points ExecStart at this checkout's
`opsloop` (verify refuses a command that is not executable), instantiates the templates, and fails on
any output of verify: it exits 0 on directives it ignores ("Failed to parse ..., ignoring"), so a silent
typo would otherwise pass.
"""

from __future__ import annotations

import configparser
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from opsloop import exitcodes

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
OPSLOOP = Path(sys.executable).parent / "opsloop"
INSTALLED = "/opt/opsloop/venv/bin/opsloop"
# template -> the instances verified (each collector: all have a drop-in, its /metrics port; one edge node)
INSTANCES = {"opsloop-collector@.service": ["haproxy", "iptables", "lvs", "ipmi", "keystone", "netperf"],
             "opsloop-actuator@.service": ["ams1"]}


def unit_sections(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(path)
    return cp


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("systemd")
    shutil.copytree(UNITS, root, dirs_exist_ok=True)
    for unit in root.glob("*.service"):
        unit.write_text(unit.read_text().replace(INSTALLED, str(OPSLOOP)))
    for template, names in INSTANCES.items():
        for name in names:
            (root / template.replace("@.", f"@{name}.")).symlink_to(template)
    return root


def verified_units(root: Path) -> list[str]:
    plain = [p.name for p in root.glob("*.service") if "@." not in p.name and not p.is_symlink()]
    return sorted(plain) + sorted(p.name for p in root.glob("*@?*.service") if p.is_symlink())


@pytest.mark.integration
def test_systemd_analyze_verify_is_clean(installed: Path) -> None:
    units = verified_units(installed)
    assert len(units) == 3 + sum(map(len, INSTANCES.values())), units
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", *(f"./{u}" for u in units)], cwd=installed,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


@pytest.mark.integration
def test_verify_catches_a_typo(installed: Path, tmp_path: Path) -> None:
    """The check above would see a mistake: verify reports an ignored directive on stderr."""
    bad = tmp_path / "opsloop-paging.service"
    bad.write_text((installed / "opsloop-paging.service").read_text().replace("Restart=on-failure", "Restart=sometimes"))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", f"./{bad.name}"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert "Failed to parse service restart specifier" in r.stderr


def test_every_service_runs_as_opsloop_restarts_and_logs_under_the_shipped_identifier() -> None:
    idents = set()
    for path in sorted(UNITS.glob("*.service")):
        s = unit_sections(path)["Service"]
        assert s["User"] == "opsloop" and s["Restart"] == "on-failure", path.name
        assert s["SyslogIdentifier"] == "opsloop", path.name   # what the log shippers match (test_logs_units.py)
        assert s["NoNewPrivileges"] == "yes" and s["ProtectSystem"] == "strict", path.name
        assert s["CapabilityBoundingSet"] == "" and s["AmbientCapabilities"] == "", path.name
        idents.add(s["SyslogIdentifier"])
        exec_start = s["ExecStart"]
        assert exec_start.startswith(INSTALLED + " ")
        for word in ("password", "token", "secret", "key"):
            assert word not in exec_start.lower(), f"{path.name}: a secret in argv? {exec_start}"
    assert idents == {"opsloop"}


def test_capabilities_only_where_the_work_needs_them() -> None:
    granted = {}
    for conf in UNITS.glob("*.service.d/*.conf"):
        s = unit_sections(conf)["Service"]
        grant = (s.get("AmbientCapabilities", ""), s.get("SupplementaryGroups", ""))
        if any(grant):   # the others only set a port (test_unit_instances.py)
            granted[f"{conf.parent.name}/{conf.name}"] = grant
    assert granted == {
        "opsloop-collector@iptables.service.d/capabilities.conf": ("CAP_NET_ADMIN CAP_NET_RAW", ""),
        "opsloop-collector@lvs.service.d/capabilities.conf": ("CAP_NET_ADMIN", ""),
        "opsloop-actuator@.service.d/haproxy.conf": ("", "haproxy"),
        "opsloop-collector@haproxy.service.d/haproxy.conf": ("", "haproxy"),   # the same admin socket
    }


@pytest.mark.parametrize("unit", sorted(p.name for p in UNITS.glob("*.service")))
def test_each_units_command_exists(unit: str) -> None:
    """ExecStart runs a real subcommand (its --help answers), with a collector instance where templated."""
    argv = unit_sections(UNITS / unit)["Service"]["ExecStart"].split()[1:]
    argv = [a.replace("%i", "iptables" if "collector" in unit else "ams1") for a in argv]
    r = subprocess.run([str(OPSLOOP), *argv, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "examples" in r.stdout.lower(), (argv, r.stdout[-400:], r.stderr[-400:])


def test_environment_overrides_in_the_units_are_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every OPSLOOP__ variable a unit sets names a real setting (the config check would reject a typo)."""
    from opsloop.config import load_settings

    for path in sorted([*UNITS.glob("*.service"), *UNITS.glob("*.service.d/*.conf")]):
        env = [line.split("=", 1)[1] for line in path.read_text().splitlines() if line.startswith("Environment=OPSLOOP__")]
        for assignment in env:
            key, value = assignment.split("=", 1)
            monkeypatch.setenv(key, value.replace("%i", "x"))
        overrides = {"controllers": {"edge": {"topology_file": "t.yaml"}}} if "edge" in path.name else None
        load_settings(overrides=overrides, discover=False)
        for assignment in env:
            monkeypatch.delenv(assignment.split("=", 1)[0])


def test_every_unit_takes_exit_78_as_final_and_restarts_on_75_and_2() -> None:
    """78 (EX_CONFIG) is what each service says of a configuration that can never work (a damaged edge overrides
    file, a Kafka login refused): before, that was 2, also the status of a taken port, so no unit could take it as
    final and a bad overrides file restarted every 5 s forever. 75 (a port taken) and 2 must still restart."""
    for path in sorted(UNITS.glob("*.service")):
        s = unit_sections(path)["Service"]
        final = s.get("RestartPreventExitStatus", "").split()
        assert final == [str(exitcodes.CONFIG)] == ["78"], (path.name, final)
        assert str(exitcodes.TEMPFAIL) not in final and str(exitcodes.USAGE) not in final, (path.name, final)
        assert s["Restart"] == "on-failure", path.name   # else 75 would not restart either


def test_a_taken_metrics_port_exits_75_which_each_unit_restarts(tmp_path: Path) -> None:
    """Each service exits 75 (EX_TEMPFAIL) when its /metrics port is taken (the edge service: its API port too),
    which a restart fixes once the port is free: each unit's command is run with its metrics port held by
    another socket, and no unit takes the status as final."""
    config = service_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSLOOP")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for path in sorted(UNITS.glob("*.service")):
            s = unit_sections(path)["Service"]
            argv = [a.replace("%i", "lvs" if "collector" in path.name else "ams1") for a in s["ExecStart"].split()[1:]]
            r = subprocess.run([str(OPSLOOP), *argv, "--config", str(config), "--metrics-port", str(port)],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
            assert f"cannot serve /metrics on 127.0.0.1:{port}" in r.stderr, (path.name, r.returncode, r.stderr[-800:])
            final = s.get("RestartPreventExitStatus", "").split()
            assert r.returncode == exitcodes.TEMPFAIL == 75, (path.name, r.returncode, r.stderr[-800:])
            assert str(r.returncode) not in final, (path.name, r.returncode, final)


def service_config(tmp_path: Path) -> Path:
    """A config every unit's command can start with (Kafka away: the ports are taken before it is needed)."""
    topology = tmp_path / "topology.yaml"
    topology.write_text(yaml.safe_dump({"listeners": [{
        "name": "web", "backend": "be_web", "edges": [{"name": "ams1"}],
        "origins": [{"name": "near", "capacity_rps": 100}, {"name": "far", "capacity_rps": 100}],
        "latency_ms": {"ams1": {"near": 2, "far": 30}}}]}))
    config = tmp_path / "opsloop.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": "127.0.0.1:1"},
        "collector": {"spool_dir": str(tmp_path / "spool")},
        "controllers": {
            "edge": {"topology_file": str(topology), "api": {"enabled": False}},
            "paging": {"alertmanager_urls": ["http://127.0.0.1:1"]},
            "actuator": {"store_dir": str(tmp_path / "store"), "targets": [{
                "edge": "ams1", "listener": "web", "kind": "haproxy", "socket": str(tmp_path / "admin.sock"),
                "backend": "be_web", "servers": {"near": "near", "far": "far"}}]}}}))
    return config
