"""`opsloop config check` prints the effective settings without the credentials URLs carry.

Alertmanager URLs may hold ``user:password@`` (from the file or ``OPSLOOP__...`` in the environment);
the printed document went to terminals and CI logs with the password in clear.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from opsloop.config_cli import main as config_main


def test_check_masks_url_credentials_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OPSLOOP__CONTROLLERS__PAGING__ALERTMANAGER_URLS",
                       '["https://ops:env-s3cret@am.example:9093", "http://am2.example:9093"]')
    assert config_main(["check", "/dev/null"]) == 0
    out = capsys.readouterr().out
    assert "env-s3cret" not in out and "ops:" not in out
    urls = yaml.safe_load(out)["controllers"]["paging"]["alertmanager_urls"]
    assert urls == ["https://***@am.example:9093", "http://am2.example:9093"]   # a URL without userinfo unchanged


def test_check_masks_url_credentials_from_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "opsloop.yaml"
    path.write_text(yaml.safe_dump({"controllers": {"paging": {
        "alertmanager_urls": ["https://ops:p@ss@am.example:9093"], "resend_interval_s": 30}}}))
    assert config_main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "p@ss" not in out
    doc = yaml.safe_load(out)
    assert doc["controllers"]["paging"]["alertmanager_urls"] == ["https://***@am.example:9093"]
    assert doc["controllers"]["paging"]["resend_interval_s"] == 30   # the rest of the document as before
