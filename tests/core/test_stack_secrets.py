"""The local stack keeps the Alertmanager config private and Prometheus's lifecycle API closed.

* The Alertmanager config given to the stack is 0600 (its receiver URLs are secrets); the copy the stack
  made with shutil.copyfile was 0644 under umask 022.
* Prometheus ran with --web.enable-lifecycle: unauthenticated POST /-/quit and /-/reload, used by nothing.

Only the builders run here (the binary lookup is stubbed): no process is started.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from opsloop import paths
from opsloop.stack import components
from tests.helpers import REPO

SECRET_CONFIG = "receivers:\n- name: chat\n  webhook_configs:\n  - url: https://hooks.example/T0/B0/SECRET\n"


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)   # the usual umask: what a plain create gives is 0644
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def no_binaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(components, "require_binary", lambda *a, **k: "/usr/bin/true")


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_alertmanager_copies_its_config_private(tmp_path: Path, umask_022: None, no_binaries: None) -> None:
    src = tmp_path / "rendered.yml"
    src.write_text(SECRET_CONFIG)
    proc = components.alertmanager(tmp_path / "stack", "127.0.0.1", 29094, src)
    copy = tmp_path / "stack" / "alertmanager" / "alertmanager.yml"
    assert f"--config.file={copy}" in proc.argv
    assert copy.read_text() == SECRET_CONFIG
    assert mode(copy) == 0o600


def test_a_config_left_world_readable_by_an_earlier_run_becomes_private(tmp_path: Path, umask_022: None,
                                                                         no_binaries: None) -> None:
    src = tmp_path / "rendered.yml"
    src.write_text(SECRET_CONFIG)
    old = tmp_path / "stack" / "alertmanager" / "alertmanager.yml"
    old.parent.mkdir(parents=True)
    old.write_text("route: {receiver: old}\n" * 10)   # longer than the new one: truncated, not overlaid
    old.chmod(0o644)
    components.alertmanager(tmp_path / "stack", "127.0.0.1", 29094, src)
    assert mode(old) == 0o600
    assert old.read_text() == SECRET_CONFIG


def test_write_private_is_never_readable_by_others_while_written(tmp_path: Path, umask_022: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # The mode from the file's creation, not set once the text is in: with the fchmod for files left
    # by an earlier run switched off, a new file must still be 0600.
    monkeypatch.setattr(paths.os, "fchmod", lambda fd, m: None)
    paths.write_private(tmp_path / "b.yml", SECRET_CONFIG)
    assert mode(tmp_path / "b.yml") == 0o600
    assert (tmp_path / "b.yml").read_text() == SECRET_CONFIG


def test_prometheus_runs_without_the_lifecycle_api(tmp_path: Path, no_binaries: None) -> None:
    proc = components.prometheus(tmp_path, "127.0.0.1", 29090, [], 5.0, None, rule_files=[])
    assert any(a.startswith("--web.listen-address=") for a in proc.argv)   # the argv the stack runs
    assert "--web.enable-lifecycle" not in proc.argv


def test_the_compose_prometheus_runs_without_the_lifecycle_api() -> None:
    compose = yaml.safe_load((REPO / "docker-compose" / "docker-compose.yml").read_text())
    command = compose["services"]["prometheus"]["command"]
    assert any(str(c).startswith("--config.file=") for c in command)
    assert not [c for svc in compose["services"].values() for c in (svc.get("command") or [])
                if "enable-lifecycle" in str(c)]
