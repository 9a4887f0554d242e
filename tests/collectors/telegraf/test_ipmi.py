"""Real Telegraf inputs.ipmi_sensor (sample config + ipmitool-opsloop wrapper) against a simulated BMC
(lab/bmcsim: OpenIPMI ipmi_sim with the DCMI extension), written by outputs.kafka to the
test Kafka: records parse with opsloop's wire parser, land on telemetry.ipmi keyed by the server,
and carry the BMC's wattage in our collector's metric (ipmi_power watts).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from opsloop.lab.bmcsim import BMCFleet, BMCSpec
from opsloop.records import Metric
from opsloop.topics import Topic
from tests.collectors.telegraf.lab import IPMITOOL_WRAPPER, ensure_telegraf, parse_all, run_telegraf, sample_config
from tests.helpers import read_topic, unique, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator:  # type: ignore[type-arg]
    ensure_telegraf()
    with BMCFleet([BMCSpec("tg-bmc", watts=155)], tmp_path_factory.mktemp("tg-bmcs")) as fleet:
        yield fleet["tg-bmc"]


def _env(bmc, host: str, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"OPSLOOP_HOST_NAME": host, "OPSLOOP_IPMI_BMC": f"{bmc.spec.username}:@lanplus(127.0.0.1:{bmc.port})",
            "OPSLOOP_IPMI_PATH": str(IPMITOOL_WRAPPER), "OPSLOOP_IPMI_PASSWORD_FILE": str(bmc.password_file),
            **extra}


def _records_of(bootstrap: str, host: str) -> list[bytes]:
    return [r.value for r in read_topic(bootstrap, Topic.IPMI.value) if r.key == host.encode()]


def _power(metrics: list[Metric]) -> list[float]:
    return [float(m.fields["watts"]) for m in metrics if m.name == "ipmi_power"]


def test_telegraf_power_readings_reach_kafka_in_our_shape(stack, bmc) -> None:  # type: ignore[no-untyped-def]
    host = unique("stor-g3")
    env = _env(bmc, host, OPSLOOP_KAFKA_BROKERS=stack.kafka_bootstrap)
    bmc.set_watts(155)
    res = run_telegraf([sample_config("ipmi")], env, "--once")
    assert res.returncode == 0, res.stderr[-1500:]
    assert bmc.spec.password not in res.stderr + res.stdout

    first = parse_all(wait_until(lambda: _records_of(stack.kafka_bootstrap, host), timeout=30, what="ipmi records"))
    assert _power(first) == [155.0]
    dcmi = next(m for m in first if m.name == "ipmi_power")
    assert dcmi.tags["host"] == host and dcmi.tags["name"] == "instantaneous_power_reading"
    assert "opsloop_topic" not in dcmi.tags  # exclude_topic_tag: routing info stays out of the labels
    assert all(m.topic is Topic.IPMI for m in first)
    # The SDR power sensor arrives too, as Telegraf's own ipmi_sensor measurement in Watts.
    sdr = [m for m in first if m.name == "ipmi_sensor" and m.tags.get("name") == "pwr_consumption"]
    assert [(m.fields["value"], m.tags["unit"]) for m in sdr] == [(155, "watts")]

    bmc.set_watts(205)  # a Gen-2 server under light load (docs/sources.md)
    res = run_telegraf([sample_config("ipmi")], env, "--once")
    assert res.returncode == 0, res.stderr[-1500:]
    both = wait_until(lambda: (lambda ms: ms if len(_power(ms)) == 2 else None)(
        parse_all(_records_of(stack.kafka_bootstrap, host))), timeout=30, what="second ipmi round")
    assert sorted(_power(both)) == [155.0, 205.0]


def test_wrapper_refuses_a_password_in_argv_without_echoing_it(bmc) -> None:  # type: ignore[no-untyped-def]
    secret = "s3cr3t-in-argv"
    res = subprocess.run([str(IPMITOOL_WRAPPER), "-H", f"127.0.0.1:{bmc.port}", "-U", "opsloop", "-P", secret,
                          "-I", "lanplus", "dcmi", "power", "reading"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert "refusing a password on the command line" in res.stderr
    assert secret not in res.stderr + res.stdout


def test_wrapper_without_a_password_file_names_the_bmc(bmc) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSLOOP_IPMI_PASSWORD")}
    res = subprocess.run([str(IPMITOOL_WRAPPER), "-H", f"127.0.0.1:{bmc.port}", "-U", "opsloop", "-P", "",
                          "-I", "lanplus", "sdr"], capture_output=True, text=True, timeout=30, env=env)
    assert res.returncode == 2
    assert f"no readable password file for BMC 127.0.0.1:{bmc.port}" in res.stderr


def test_per_bmc_password_file_wins_and_a_wrong_one_fails_the_gather(bmc, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pw_dir = tmp_path / "bmc-passwords"
    pw_dir.mkdir()
    wrong = pw_dir / f"127.0.0.1:{bmc.port}"
    wrong.write_text("not-the-password\n")
    wrong.chmod(0o600)
    env = _env(bmc, "stor-wrong-pw", OPSLOOP_IPMI_PASSWORD_DIR=str(pw_dir))
    # --test: gather once and print, no output plugin.
    res = run_telegraf([sample_config("ipmi")], env, "--test")
    assert res.returncode != 0
    assert "inputs.ipmi_sensor" in res.stderr and "-P REDACTED" in res.stderr
    assert bmc.spec.password not in res.stderr and "not-the-password" not in res.stderr
