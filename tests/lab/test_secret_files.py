"""The lab writes its secret files private from their creation, never write-then-chmod.

A file written with ``write_text`` (0644 under umask 022) and ``chmod``-ed afterwards is readable by
everyone for a moment, and for good when the chmod never runs. ``Path.chmod`` is disabled here, so a
file is only private if it was created so: the PagerDuty routing key and the effective config of
`opsloop run`, the simulated BMC's password file and lan.conf (which holds the password too).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsloop.lab import pipeline
from opsloop.lab.bmcsim import fleet

SECRET_URL = "https://ops:s3cret-pw@am.example:9093"


@pytest.fixture(autouse=True)
def no_late_chmod(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    old = os.umask(0o022)   # the usual umask: a plain create gives 0644
    chmodded: list[Path] = []
    monkeypatch.setattr(Path, "chmod", lambda self, *a, **k: chmodded.append(self))
    try:
        yield chmodded
    finally:
        os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_the_lab_routing_key_is_private_from_creation(tmp_path: Path) -> None:
    am = pipeline.alertmanager_config(tmp_path)
    key = tmp_path / "pager" / "pagerduty-routing-key"
    assert key.read_text() == "lab-routing-key\n"
    assert mode(key) == 0o600
    assert mode(am) == 0o600


def test_the_routing_key_of_an_earlier_run_is_made_private(tmp_path: Path) -> None:
    key = tmp_path / "pager" / "pagerduty-routing-key"
    key.parent.mkdir()
    key.write_text("old\n")
    os.chmod(key, 0o644)
    pipeline.alertmanager_config(tmp_path)
    assert (key.read_text(), mode(key)) == ("lab-routing-key\n", 0o600)


def test_the_effective_config_is_private_from_creation(tmp_path: Path) -> None:
    user = tmp_path / "user.yaml"
    user.write_text(yaml.safe_dump({"controllers": {"paging": {"alertmanager_urls": [SECRET_URL]}}}))
    run_dir = tmp_path / "run"
    settings, path = pipeline.effective_config(user, run_dir)
    assert path == run_dir / "opsloop.yaml"
    assert settings.controllers["paging"]["alertmanager_urls"] == [SECRET_URL]   # the services still read it
    assert mode(path) == 0o600


def test_a_world_readable_effective_config_of_an_earlier_run_is_made_private(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "opsloop.yaml").write_text("{}\n")
    os.chmod(run_dir / "opsloop.yaml", 0o644)
    _, path = pipeline.effective_config(None, run_dir)
    assert mode(path) == 0o600


class _Ran:
    returncode = 0
    stdout = ""
    stderr = ""


def test_the_simulated_bmc_password_files_are_private_from_creation(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    # sdrcomp is not what is tested: the config files are written before it runs
    monkeypatch.setattr(fleet.subprocess, "run", lambda *a, **k: calls.append(a) or _Ran())
    bmc = fleet.SimulatedBMC(fleet.BMCSpec(name="bmc0", dcmi=False, password="pw-1234"), tmp_path, 40001)
    assert calls   # the whole config was written
    assert bmc.password_file.read_text() == "pw-1234\n"
    assert mode(bmc.password_file) == 0o600
    lan = tmp_path / "bmc0" / "lan.conf"
    assert "pw-1234" in lan.read_text()
    assert mode(lan) == 0o600
