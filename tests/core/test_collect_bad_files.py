"""`opsloop collect` given a file its section names that it cannot use (the IPMI inventory, the BMC
password file, Keystone's probe credentials): one line naming the file, no traceback, nothing of the
secret. Before: a traceback for any bad inventory (not YAML, not UTF-8, a bad field), and for a Keystone
credentials file that is not UTF-8; a secret put in the inventory's password_env was printed whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_cli, write_config

SECRET = "hunter2-secret"


def check(r, file: Path, code: int) -> str:  # type: ignore[no-untyped-def]
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert str(file) in lines[0] and SECRET not in r.stderr + r.stdout, lines[0]
    return lines[0]


@pytest.mark.parametrize("content,says", [
    (b"hosts:\n  - {name: a, bmc: \"x}\n", "not valid YAML: line 3, column 1"),
    ("hosts:\n  - {name: r\xe9seau, bmc: x}\n".encode("latin-1"), "not UTF-8 text"),
    (f"hosts:\n  - {{name: a, bmc: x, password_env: \"{SECRET}!\"}}\n".encode(), "hosts.0.password_env"),
], ids=["not YAML", "not UTF-8", "a secret in password_env"])
def test_a_bad_ipmi_inventory_is_one_line_and_exit_78(tmp_path: Path, content: bytes, says: str) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_bytes(content)
    cfg = write_config(tmp_path / "c.yaml", {"collectors": {"ipmi": {"inventory": str(inventory)}}})
    # 78 (EX_CONFIG, with or without --once): a file that can never work, systemd does not restart the collector
    assert says in check(run_cli("collect", "ipmi", "--once", "--stdout", "--config", str(cfg)), inventory, 78)


def test_a_bmc_password_file_not_utf8_names_the_file(tmp_path: Path) -> None:
    pw = tmp_path / "bmc-password"
    pw.write_bytes(b"p\xe9ss")
    pw.chmod(0o600)
    cfg = write_config(tmp_path / "c.yaml", {"collectors": {"ipmi": {"hosts": [
        {"name": "a", "bmc": "127.0.0.1", "username": "u", "password_file": str(pw)}]}}})
    r = run_cli("collect", "ipmi", "--once", "--stdout", "--config", str(cfg))
    assert r.returncode == 1
    assert f"auth: password file {pw} of a: not UTF-8 text" in r.stderr, r.stderr


def test_keystone_credentials_not_utf8_names_the_file(tmp_path: Path) -> None:
    creds = tmp_path / "keystone-probe.yaml"
    creds.write_bytes(f"username: probe\npassword: {SECRET}\xe9\nproject: service\n".encode("latin-1"))
    creds.chmod(0o600)
    cfg = write_config(tmp_path / "c.yaml", {"collectors": {"keystone": {
        "url": "http://127.0.0.1:1", "probes": {"credentials_file": str(creds)}}}})
    assert "not UTF-8 text" in check(run_cli("collect", "keystone", "--once", "--stdout", "--config", str(cfg)),
                                     creds, 1)
