"""`opsloop page render-config`: the Alertmanager config it writes holds the receivers' URLs, which
are often secrets themselves (a Slack or chat webhook URL is its own token, a URL may carry
user:password@). It is created 0600; a place it cannot write is one line, exit 2 (was a traceback);
a refused URL is named without its credentials (was printed whole)."""

from __future__ import annotations

import stat
from pathlib import Path

from tests.helpers import run_cli

SECRET = "s3cr3t-pw"


def render(tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    key = tmp_path / "routing-key"
    key.write_text("k")
    return run_cli("page", "render-config", "--routing-key-file", str(key), *extra)


def test_the_rendered_config_is_private_from_creation(tmp_path: Path) -> None:
    out = tmp_path / "alertmanager.yml"
    r = render(tmp_path, "--webhook-url", f"https://ops:{SECRET}@hooks.example/T0/B0", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert SECRET in out.read_text()                     # Alertmanager needs it: the file holds a secret
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_an_unwritable_output_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "alertmanager.yml"
    r = render(tmp_path, "--webhook-url", "http://127.0.0.1:8099", "--output", str(out))
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(out) in r.stderr


def test_a_refused_url_is_named_without_its_credentials(tmp_path: Path) -> None:
    r = render(tmp_path, "--webhook-url", f"ftp://ops:{SECRET}@hooks.example/")
    assert r.returncode == 2 and "must start with http://" in r.stderr
    assert SECRET not in r.stderr, r.stderr
