"""Telegraf's inputs.ipmi_sensor (the sample config and ipmitool-opsloop) against BMCs whose DCMI answer is no
reading: a deactivated power meter (all zeros) and a short reply (ipmitool prints stack garbage as Watts).
Telegraf reads every "N Watts" line as a reading; before, these became ipmi_power 0 W and 65435 W records.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from opsloop.lab.bmcsim import BMCFleet, BMCSpec
from opsloop.records import Metric
from tests.collectors.telegraf.lab import IPMITOOL_WRAPPER, ensure_telegraf, parse_all, run_once, sample_config
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BMCFleet]:
    ensure_telegraf()
    specs = [BMCSpec("tg-deact", watts="na"), BMCSpec("tg-short", watts="short"), BMCSpec("tg-ok", watts=205),
             BMCSpec("tg-nodcmi", dcmi=False, watts=180)]
    with BMCFleet(specs, tmp_path_factory.mktemp("tg-dcmi-bmcs")) as f:
        yield f


def _env(bmc, host: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"OPSLOOP_HOST_NAME": host, "OPSLOOP_IPMI_BMC": f"{bmc.spec.username}:@lanplus(127.0.0.1:{bmc.port})",
            "OPSLOOP_IPMI_PATH": str(IPMITOOL_WRAPPER), "OPSLOOP_IPMI_PASSWORD_FILE": str(bmc.password_file)}


def _gather(bmc, tmp_path: Path) -> tuple[list[Metric], str]:  # type: ignore[no-untyped-def]
    records, res = run_once(sample_config("ipmi"), _env(bmc, bmc.name), tmp_path)
    return parse_all(records), res.stderr


def _power(metrics: list[Metric]) -> list[float]:
    return [float(m.fields["watts"]) for m in metrics if m.name == "ipmi_power"]


def _sdr_watts(metrics: list[Metric]) -> list[float]:
    return [float(m.fields["value"]) for m in metrics
            if m.name == "ipmi_sensor" and m.tags.get("name") == "pwr_consumption"]


def test_deactivated_meter_is_an_error_not_zero_watts(fleet: BMCFleet, tmp_path: Path) -> None:
    metrics, stderr = _gather(fleet["tg-deact"], tmp_path)
    assert _power(metrics) == []   # was [0.0]
    assert not any(m.tags.get("unit") == "watts" and m.tags["name"].endswith("sampling_period") for m in metrics)
    assert "DCMI power reading state is deactivated" in stderr and "inputs.ipmi_sensor" in stderr
    assert fleet["tg-deact"].spec.password not in stderr


def test_short_reply_garbage_is_an_error_not_a_reading(fleet: BMCFleet, tmp_path: Path) -> None:
    metrics, stderr = _gather(fleet["tg-short"], tmp_path)
    assert _power(metrics) == []   # was [65435.0]
    assert "is above OPSLOOP_IPMI_MAX_WATTS=10000" in stderr


def test_good_reading_still_arrives_with_the_sdr(fleet: BMCFleet, tmp_path: Path) -> None:
    metrics, stderr = _gather(fleet["tg-ok"], tmp_path)
    assert _power(metrics) == [205.0], stderr[-1500:]
    assert _sdr_watts(metrics) == [205.0]
    assert any(m.name == "ipmi_sensor" and m.tags["name"] == "average_power_reading_over_sample_period"
               for m in metrics)


def test_in_band_bmc_without_dcmi_still_reports_its_sdr(fleet: BMCFleet, tmp_path: Path) -> None:
    # A failed DCMI call (no DCMI here; a reading the wrapper refuses alike) costs the BMC none of its SDR
    # readings, in-band too (the sample's servers = [""]). "In-band" here: a shim adding the simulator's LAN options.
    bmc = fleet["tg-nodcmi"]
    shim = tmp_path / "ipmitool-in-band"
    shim.write_text("#!/bin/sh\nexec ipmitool -I lanplus -H 127.0.0.1 -p {port} -U {user} -f {pw} -C 3 -N 1 -R 1 "
                    "\"$@\"\n".format(port=bmc.port, user=bmc.spec.username, pw=bmc.password_file))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {"OPSLOOP_HOST_NAME": bmc.name, "OPSLOOP_IPMI_BMC": "", "OPSLOOP_IPMI_PATH": str(IPMITOOL_WRAPPER),
           "OPSLOOP_IPMITOOL_BIN": str(shim)}
    records, res = run_once(sample_config("ipmi"), env, tmp_path)
    metrics = parse_all(records)
    assert _sdr_watts(metrics) == [180.0], res.stderr[-1500:]
    assert _power(metrics) == []
    assert "inputs.ipmi_sensor" in res.stderr   # DCMI's failure is still in Telegraf's log


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def test_terminated_wrapper_leaves_no_ipmitool_behind(tmp_path: Path) -> None:
    # Telegraf's timeout sends SIGTERM to the wrapper only (it starts no process group); the checked DCMI call
    # runs ipmitool as a child, which must go with it. The stand-in never ends on its own: a hung ipmitool.
    hung = tmp_path / "ipmitool-hung"
    hung.write_text("#!/bin/sh\nexec sleep 600\n")
    hung.chmod(0o755)
    pw = tmp_path / "pw"
    pw.write_text("pw-for-nobody\n")
    pw.chmod(0o600)
    env = {**os.environ, "OPSLOOP_IPMI_PASSWORD_FILE": str(pw), "OPSLOOP_IPMITOOL_BIN": str(hung)}
    proc = subprocess.Popen([str(IPMITOOL_WRAPPER), "-H", "127.0.0.1:1623", "-U", "u", "-P", "", "-I", "lanplus",
                             "dcmi", "power", "reading"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    # the hung stand-in, not one of the wrapper's short-lived $(...) subshells
    child = wait_until(lambda: next((c for c in _children(proc.pid) if _cmdline(c)[:1] == ["sleep"]), None),
                       timeout=20, interval=0.05, what="ipmitool started by the wrapper")
    try:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 143 and out == b""
        wait_until(lambda: not _running(child), timeout=20, interval=0.05, what="ipmitool killed with the wrapper")
    finally:
        if _running(child):
            os.kill(child, signal.SIGKILL)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode() for a in f.read().split(b"\0") if a]
    except FileNotFoundError:
        return []


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
