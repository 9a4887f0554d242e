"""The exit status of each service, as its systemd unit runs it, tells systemd whether a restart can help.

Each unit's ExecStart is run with the unit's own environment (OPSLOOP_CONFIG and the OPSLOOP__ settings, their
/var/lib/opsloop paths moved under a temporary folder). A configuration that can never work exits 78
(EX_CONFIG, the unit's RestartPreventExitStatus: no restart every 5 s forever); before, it was 2, the same
status as a taken port. The taken port (75) is in test_systemd_units.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Sequence

import pytest
import yaml
from kafka.errors import KafkaTimeoutError

from opsloop import exitcodes
from opsloop.config import ConfigError
from opsloop.controllers.actuators.config import ActuatorConfigError
from opsloop.kafka_security import KafkaSecurityError, KafkaUnreachable
from tests.deploy.test_systemd_units import INSTALLED, OPSLOOP, UNITS, service_config, unit_sections
from tests.helpers import run_cli

UNIT_NAMES = sorted(p.name for p in UNITS.glob("*.service"))


def run_unit(unit: str, tmp_path: Path, config: Path, instance: str = "",
             extra: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """The unit's command and environment, with its state under ``tmp_path/var`` and the given config file
    (``extra``: arguments after the unit's own)."""
    s = unit_sections(UNITS / unit)["Service"]
    instance = instance or ("lvs" if "collector" in unit else "ams1")
    var = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSLOOP")}
    for line in (UNITS / unit).read_text().splitlines():
        if line.startswith("Environment="):
            key, value = line.removeprefix("Environment=").split("=", 1)
            env[key] = value.replace("/var/lib/opsloop", str(var)).replace("%i", instance)
    assert env["OPSLOOP_CONFIG"] == "/etc/opsloop/opsloop.yaml", unit   # what is swapped for the test's file
    env["OPSLOOP_CONFIG"] = str(config)
    argv = [a.replace("%i", instance) for a in s["ExecStart"].split()]
    assert argv[0] == INSTALLED
    return subprocess.run([str(OPSLOOP), *argv[1:], "--metrics-port", "0", *extra], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env)


def refused(r: subprocess.CompletedProcess[str], unit: str, says: str) -> None:
    assert r.returncode == exitcodes.CONFIG == 78, (unit, r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and says in r.stderr, (unit, r.stderr[-2000:])


@pytest.mark.parametrize("unit", UNIT_NAMES)
def test_a_config_file_that_is_not_yaml_exits_78(unit: str, tmp_path: Path) -> None:
    config = tmp_path / "opsloop.yaml"
    config.write_text("kafka:\n  bootstrap_servers: \"127.0.0.1:1\n")
    refused(run_unit(unit, tmp_path, config), unit, f"config file {config}: not valid YAML")


@pytest.mark.parametrize("unit", UNIT_NAMES)
def test_a_setting_of_a_wrong_type_exits_78(unit: str, tmp_path: Path) -> None:
    config = service_config(tmp_path)
    doc = yaml.safe_load(config.read_text())
    doc["kafka"]["partitions"] = "many"
    config.write_text(yaml.safe_dump(doc))
    refused(run_unit(unit, tmp_path, config), unit, "kafka.partitions")


@pytest.mark.parametrize("unit", UNIT_NAMES)
def test_an_unreadable_kafka_password_file_exits_78(unit: str, tmp_path: Path) -> None:
    """The Kafka preflight every service runs (opsloop.kafka_clients.EXIT_KAFKA_SETTINGS): no broker is needed
    to find the password file missing. Each service gets there past its /metrics port (0: any free one)."""
    config = service_config(tmp_path)
    doc = yaml.safe_load(config.read_text())
    missing = tmp_path / "secrets" / "kafka-password"
    doc["kafka"]["security"] = {"protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "username": "opsloop",
                                "password_file": str(missing)}
    config.write_text(yaml.safe_dump(doc))
    r = run_unit(unit, tmp_path, config)
    refused(r, unit, "kafka_preflight_failed")
    assert str(missing) in r.stderr, r.stderr[-2000:]


UNREADABLE = {"missing": None, "not UTF-8": b"# r\xe9seau\nkafka: {}\n"}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
@pytest.mark.parametrize("unit", UNIT_NAMES)
def test_a_config_file_on_the_command_line_that_cannot_be_read_exits_78(unit: str, case: str, tmp_path: Path) -> None:
    """`opsloop <service> --config FILE` (by hand, or a unit changed to name its file): the `opsloop` front door
    reads the file before the service's module is imported, and refused it with 2, systemd's cue to restart."""
    given = tmp_path / "typo.yaml"
    if UNREADABLE[case] is not None:
        given.write_bytes(UNREADABLE[case])
    r = run_unit(unit, tmp_path, service_config(tmp_path), extra=("--config", str(given)))
    refused(r, unit, f"config file {given}: ")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]


@pytest.mark.parametrize("argv", [("weights", "show", "--edge", "ams1"), ("edge", "check"), ("weights", "history"),
                                  ("deadletter", "summary"), ("stack", "status")], ids=" ".join)
def test_a_one_shot_command_keeps_2_for_a_config_file_it_cannot_read(argv: tuple[str, ...], tmp_path: Path) -> None:
    missing = tmp_path / "typo.yaml"
    r = run_cli(*argv, "--config", str(missing), timeout=60)
    assert r.returncode == 2 and f"config file {missing}: cannot read" in r.stderr, (r.returncode, r.stderr[-2000:])


def test_the_edge_service_with_a_damaged_overrides_file_exits_78(tmp_path: Path) -> None:
    """docs/deploying.md's case: the overrides file the unit names is damaged; every restart meets it again."""
    overrides = tmp_path / "var" / "edge" / "overrides.json"   # the unit's OVERRIDES_FILE, moved under tmp_path
    overrides.parent.mkdir(parents=True)
    overrides.write_text('{"version": 1, "capacity_rps": ')
    r = run_unit("opsloop-edge.service", tmp_path, service_config(tmp_path))
    refused(r, "opsloop-edge.service", f"edge API overrides {overrides}: cannot be read")


def test_an_actuator_for_an_edge_with_no_target_exits_78(tmp_path: Path) -> None:
    """The template's instance names the edge (--edge %i): an instance the config has no target for never works."""
    r = run_unit("opsloop-actuator@.service", tmp_path, service_config(tmp_path), instance="nowhere")
    refused(r, "opsloop-actuator@nowhere.service", "edges ['nowhere']: no actuator targets configured for them")


def test_a_collector_with_a_spool_dir_it_cannot_create_exits_78(tmp_path: Path) -> None:
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "spool").write_text("")   # the unit's spool_dir (/var/lib/opsloop/spool/%i) is below a file
    r = run_unit("opsloop-collector@.service", tmp_path, service_config(tmp_path))
    refused(r, "opsloop-collector@lvs.service", f"collector.spool_dir {tmp_path / 'var' / 'spool' / 'lvs' / 'lvs'}")


@pytest.mark.parametrize(("error", "status"), [
    (ConfigError("config file x: 1 error"), exitcodes.CONFIG),
    (ActuatorConfigError("controllers.actuator: max_step"), exitcodes.CONFIG),
    (ValueError("edges ['x']: no actuator targets configured for them"), exitcodes.CONFIG),
    (KafkaSecurityError("kafka.security.password_file: cannot read"), exitcodes.CONFIG),
    (KafkaUnreachable("no broker answered"), exitcodes.TEMPFAIL),   # a KafkaSecurityError, but no settings error
    (KafkaTimeoutError("Failed to update metadata after 5.0 secs."), exitcodes.TEMPFAIL),
    (ConnectionRefusedError(111, "Connection refused"), exitcodes.TEMPFAIL),
    (RuntimeError("anything else"), exitcodes.TEMPFAIL),
])
def test_the_actuators_start_failures_are_told_apart(error: Exception, status: int) -> None:
    from opsloop.controllers.actuators.cli import start_failure_status   # here: the rest of the module runs without it

    assert start_failure_status(error) == status


def test_the_codes_are_the_sysexits_ones() -> None:
    assert (exitcodes.USAGE, exitcodes.SOFTWARE, exitcodes.TEMPFAIL, exitcodes.CONFIG) == (2, 70, 75, 78)
