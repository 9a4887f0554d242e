"""IPMI collector config, inventory, credentials and the process runner (no BMC needed)."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from opsloop.collectors.ipmi import Config, InventoryError, build
from opsloop.collectors.ipmi.config import resolve_hosts
from opsloop.collectors.ipmi.credentials import CredentialError, resolve_password, scrub
from opsloop.collectors.ipmi.runner import run_tool
from opsloop.collect.types import CollectorUnavailable
from tests.helpers import REPO

SAMPLE = REPO / "collectors" / "ipmi" / "sample.yaml"


def test_sample_config_is_valid() -> None:
    section = yaml.safe_load(SAMPLE.read_text())["collectors"]["ipmi"]
    collector = build(Config.model_validate(section))
    assert collector.name == "ipmi"
    g3 = next(h for h in collector.hosts if h.name == "stor-g3-17")
    assert (g3.source, g3.power_sensor, g3.password_env, g3.username) == (
        "sdr", "Pwr Consumption", "OPSLOOP_BMC_G3_PASSWORD", "opsloop")
    assert g3.metadata.disks == 12


def test_unknown_field_is_named() -> None:
    with pytest.raises(ValidationError, match="concurency"):
        Config.model_validate({"hosts": [{"name": "a", "bmc": "x"}], "concurency": 4})


def test_bad_values_are_named() -> None:
    with pytest.raises(ValidationError, match="cipher_suite"):
        Config.model_validate({"hosts": [{"name": "a", "bmc": "x"}], "cipher_suite": 99})
    with pytest.raises(ValidationError, match="metadata.disks"):
        Config.model_validate({"hosts": [{"name": "a", "bmc": "x", "metadata": {"disks": -1}}]})


def test_zero_retries_is_refused_because_ipmitool_reads_it_as_four() -> None:
    with pytest.raises(ValidationError, match="retries"):
        Config.model_validate({"hosts": [{"name": "a", "bmc": "x"}], "retries": 0})


def test_bmcsim_cli_rejects_bad_counts_and_builds_the_three_generation_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    from opsloop.lab.bmcsim.__main__ import fleet_specs, main

    with pytest.raises(SystemExit) as e:
        main(["--count", "2", "--dead", "3", "--inventory", "/dev/null"])
    assert e.value.code == 2 and "--dead" in capsys.readouterr().err
    specs, metadata = fleet_specs(8, 2)
    assert [s.watts for s in specs[:3]] == [248, 205, 155]
    assert [s.dead for s in specs].count(True) == 2 and [s.dcmi for s in specs].count(False) == 2
    assert metadata[specs[2].name]["generation"] == "gen3"


def test_config_without_hosts_says_what_to_give() -> None:
    with pytest.raises(ValidationError, match="inventory"):
        Config.model_validate({})


def test_password_env_must_be_a_name_not_a_secret() -> None:
    with pytest.raises(ValidationError, match="password_env") as e:
        Config.model_validate({"hosts": [{"name": "a", "bmc": "x", "password_env": "hunter2!secret"}]})
    assert "environment variable name" in str(e.value)


def test_inventory_file_defaults_and_overrides(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({
        "defaults": {"username": "ops", "password_env": "BMC_PW", "port": 6230},
        "hosts": [{"name": "a", "bmc": "10.0.0.1"},
                  {"name": "b", "bmc": "10.0.0.2", "password_file": "/etc/pw", "cipher_suite": 17}],
    }))
    hosts = resolve_hosts(Config(inventory=inv, defaults={"username": "fallback"}))
    a, b = hosts
    assert (a.username, a.password_env, a.port, a.cipher_suite) == ("ops", "BMC_PW", 6230, 3)
    # A host's own password reference replaces the default one instead of adding a second.
    assert (b.password_file, b.password_env, b.cipher_suite) == (Path("/etc/pw"), None, 17)


@pytest.mark.parametrize("content, message", [
    ("hosts: [{name: a}]", "hosts.0.bmc"),
    ("hosts: [{name: a, bmc: x}, {name: a, bmc: y}]", "twice"),
    ("- just\n- a list", "expected a mapping"),
    ("hosts: [{name: a, bmc: x, colour: red}]", "colour"),
    ("{unclosed", "not valid YAML"),
])
def test_bad_inventory_names_file_and_field(tmp_path: Path, content: str, message: str) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(content)
    with pytest.raises(InventoryError, match=message) as e:
        build(Config(inventory=inv))
    assert str(inv) in str(e.value)


def test_missing_inventory_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="No such file"):
        build(Config(inventory=tmp_path / "nope.yaml"))


def test_missing_ipmitool_makes_the_collector_unavailable() -> None:
    collector = build(Config(hosts=[{"name": "a", "bmc": "127.0.0.1"}], ipmitool="/nonexistent/ipmitool"))
    with pytest.raises(CollectorUnavailable, match="apt-get install ipmitool"):
        collector.collect()


# --- credentials --------------------------------------------------------------------------------

def _host(**kw: object):  # type: ignore[no-untyped-def]
    return resolve_hosts(Config(hosts=[{"name": "a", "bmc": "x", **kw}]))[0]


def test_password_from_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o600)
    assert resolve_password(_host(password_file=str(pw))) == "s3cret"
    monkeypatch.setenv("OPSLOOP_TEST_BMC_PW", "from-env")
    assert resolve_password(_host(password_env="OPSLOOP_TEST_BMC_PW")) == "from-env"


def test_world_readable_password_file_is_refused(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o644)
    with pytest.raises(CredentialError, match="chmod 600") as e:
        resolve_password(_host(password_file=str(pw)))
    assert "s3cret" not in str(e.value)


def test_unset_password_env_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPSLOOP_TEST_UNSET", raising=False)
    with pytest.raises(CredentialError, match="OPSLOOP_TEST_UNSET"):
        resolve_password(_host(password_env="OPSLOOP_TEST_UNSET"))


def test_overlong_password_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSLOOP_TEST_LONG", "x" * 21)
    with pytest.raises(CredentialError, match="20 bytes"):
        resolve_password(_host(password_env="OPSLOOP_TEST_LONG"))


def _resolve_in_thread(path: Path) -> list[object]:
    """resolve_password in a thread, joined with a generous deadline: the old code blocked for ever
    in open() on a FIFO. A writer opened and closed afterwards releases such a reader."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(resolve_password(_host(password_file=str(path))))
        except CredentialError as e:
            result.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive() and stat.S_ISFIFO(os.stat(path).st_mode):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))   # EOF for the blocked reader
        t.join(30)
    assert not t.is_alive()
    return result


def test_password_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "pw.fifo"
    os.mkfifo(fifo, 0o600)   # no writer: a plain open() for reading waits for one for ever
    [err] = _resolve_in_thread(fifo)
    assert isinstance(err, CredentialError) and "not a regular file" in str(err), err


def test_password_file_that_is_a_device_or_huge_is_refused(tmp_path: Path) -> None:
    # /dev/zero was read until memory ran out; /dev/null stands in for any device (safe on the old code)
    [err] = _resolve_in_thread(Path("/dev/null"))
    assert isinstance(err, CredentialError) and "not a regular file" in str(err), err
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100_000)
    big.chmod(0o600)
    with pytest.raises(CredentialError, match="larger than 4096 bytes"):
        resolve_password(_host(password_file=str(big)))


def test_scrub_removes_the_secret() -> None:
    assert scrub("bad password s3cret for user", "s3cret") == "bad password *** for user"


# --- runner -------------------------------------------------------------------------------------

def _gone(pid: int) -> bool:
    """True once pid is no process (or an unreaped zombie of someone else) - bounded wait."""
    for _ in range(200):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)
    return False


def test_timeout_kills_the_whole_process_group() -> None:
    # The tool forks a child that would outlive it; both must be gone after the timeout.
    script = "sleep 300 & echo child=$!; sleep 300"
    res = run_tool(["bash", "-c", script], timeout_s=0.5)
    assert res.timed_out and res.returncode is None
    child = int(res.stdout.split("child=")[1].split()[0])
    assert _gone(child)


def test_output_and_exit_code_are_returned() -> None:
    res = run_tool(["bash", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10)
    assert (res.returncode, res.stdout, res.stderr, res.timed_out) == (3, "out\n", "err\n", False)


def test_environment_is_exactly_what_we_pass() -> None:
    res = run_tool(["/usr/bin/env"], timeout_s=10, env={"IPMI_PASSWORD": "p", "PATH": os.environ["PATH"]})
    assert sorted(res.stdout.split()) == sorted(["IPMI_PASSWORD=p", f"PATH={os.environ['PATH']}"])
