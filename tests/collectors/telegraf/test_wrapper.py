"""collectors/telegraf/ipmitool-opsloop, the wrapper Telegraf's inputs.ipmi_sensor runs instead of ipmitool:
the argv it hands to ipmitool (recorded by a stand-in binary), fuzzed with hypothesis.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.collectors.telegraf.lab import IPMITOOL_WRAPPER

# Prints each argument on its own line, so the test sees exactly what ipmitool would get.
RECORDER = "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n"

hosts = st.from_regex(r"[a-z0-9][a-z0-9.\-]{0,30}", fullmatch=True)
ports = st.integers(min_value=1, max_value=65535)
secrets = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                  min_size=1, max_size=40)
commands = st.sampled_from([["sdr", "elist"], ["dcmi", "power", "reading"], ["chassis", "power", "status"]])


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fake-ipmitool")
    exe = d / "ipmitool"
    exe.write_text(RECORDER)
    exe.chmod(0o755)
    (d / "pw").write_text("pw\n")
    (d / "pw").chmod(0o600)
    return exe


def _run(recorder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OPSLOOP_IPMI")}
    return subprocess.run([str(IPMITOOL_WRAPPER), *args], capture_output=True, text=True, timeout=10,
                          env={**base, "OPSLOOP_IPMITOOL_BIN": str(recorder), **env})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host=hosts, port=ports, command=commands, lanplus=st.booleans())
def test_translates_telegrafs_call(recorder: Path, host: str, port: int, command: list[str], lanplus: bool) -> None:
    intf = "lanplus" if lanplus else "lan"
    pw = str(recorder.parent / "pw")
    res = _run(recorder, "-H", f"{host}:{port}", "-U", "opsloop", "-P", "", "-I", intf, "-L", "ADMINISTRATOR",
               *command, OPSLOOP_IPMI_PASSWORD_FILE=pw)
    assert res.returncode == 0, res.stderr
    argv = res.stdout.splitlines()
    assert "-P" not in argv
    assert argv[argv.index("-H") + 1] == host and argv[argv.index("-p") + 1] == str(port)
    assert argv[argv.index("-f") + 1] == pw
    assert argv[argv.index("-U") + 1] == "opsloop" and argv[argv.index("-L") + 1] == "ADMINISTRATOR"
    assert argv[-len(command):] == command
    assert ("-C" in argv) == lanplus  # cipher suite 3 only for IPMI v2 (lanplus)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=secrets, host=hosts)
def test_never_forwards_or_echoes_a_password(recorder: Path, secret: str, host: str) -> None:
    res = _run(recorder, "-H", host, "-U", "u", "-P", secret, "-I", "lanplus", "sdr",
               OPSLOOP_IPMI_PASSWORD_FILE=str(recorder.parent / "pw"))
    reference = _run(recorder, "-H", host, "-U", "u", "-P", "x", "-I", "lanplus", "sdr")
    assert res.returncode == 2
    assert res.stdout == ""  # ipmitool never ran
    # The message is the same whatever the password: nothing of it is echoed.
    assert res.stderr == reference.stderr and "refusing a password" in res.stderr


def test_in_band_call_passes_through_without_credentials(recorder: Path) -> None:
    res = _run(recorder, "sdr", "elist")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["sdr", "elist"]


def test_per_bmc_file_overrides_the_default(recorder: Path, tmp_path: Path) -> None:
    (tmp_path / "10.0.0.17").write_text("x\n")
    (tmp_path / "10.0.0.17").chmod(0o600)
    res = _run(recorder, "-H", "10.0.0.17", "-U", "u", "-P", "", "-I", "lanplus", "sdr",
               OPSLOOP_IPMI_PASSWORD_DIR=str(tmp_path), OPSLOOP_IPMI_PASSWORD_FILE=str(recorder.parent / "pw"))
    argv = res.stdout.splitlines()
    assert argv[argv.index("-f") + 1] == str(tmp_path / "10.0.0.17") and "-p" not in argv


@pytest.mark.parametrize("argv,error", [
    (["-H"], "-H needs a value"),
    (["-H", "h", "-U", "u", "-P"], "-P needs a value"),
])
def test_truncated_options_are_named(recorder: Path, argv: list[str], error: str) -> None:
    res = _run(recorder, *argv)
    assert res.returncode == 2 and error in res.stderr


def test_pointing_the_wrapper_at_itself_is_refused(recorder: Path) -> None:
    res = _run(recorder, "sdr", OPSLOOP_IPMITOOL_BIN=str(IPMITOOL_WRAPPER))
    assert res.returncode == 2 and "points at this wrapper" in res.stderr


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_password_file_open_to_others_is_refused_without_printing_it(recorder: Path, tmp_path: Path,
                                                                        mode: int) -> None:
    # opsloop's own reader refuses such a file; before, the wrapper handed it to ipmitool -f all the same
    pw = tmp_path / "bmc-pw"
    pw.write_text("S3cr3t-BMC-pw\n")
    pw.chmod(mode)
    res = _run(recorder, "-H", "10.0.0.17", "-U", "u", "-P", "", "-I", "lanplus", "sdr",
               OPSLOOP_IPMI_PASSWORD_FILE=str(pw))
    assert res.returncode == 2 and res.stdout == ""   # ipmitool never ran
    assert f"password file {pw} for BMC 10.0.0.17 is open to group/others (mode {mode:o}): chmod 600" in res.stderr
    assert "S3cr3t" not in res.stderr
    # the per-BMC file is held to the same rule
    (tmp_path / "10.0.0.17").write_text("S3cr3t-BMC-pw\n")
    (tmp_path / "10.0.0.17").chmod(mode)
    res = _run(recorder, "-H", "10.0.0.17", "-U", "u", "-P", "", "-I", "lanplus", "sdr",
               OPSLOOP_IPMI_PASSWORD_DIR=str(tmp_path))
    assert res.returncode == 2 and res.stdout == "" and "open to group/others" in res.stderr


def test_a_fifo_as_password_file_is_refused(recorder: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pw.fifo"
    os.mkfifo(fifo, 0o600)   # ipmitool -f would wait on it for a writer until Telegraf's timeout
    res = _run(recorder, "-H", "10.0.0.17", "-U", "u", "-P", "", "-I", "lanplus", "sdr",
               OPSLOOP_IPMI_PASSWORD_FILE=str(fifo))
    assert res.returncode == 2 and res.stdout == "" and "is not a regular file" in res.stderr
