"""`opsloop config check` prints the effective settings without the secrets the stage sections carry.

The stage sections (``audit``, ``controllers.*``, ``streams.*``) are printed as given, mappings and not their
models: ``audit.elasticsearch.password`` and ``api_key`` (the file or ``OPSLOOP__...``) went to terminals and CI
logs in clear, where the core's ``kafka.security.password`` (a SecretStr) was masked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from opsloop.config_cli import main as config_main


def _check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict]:
    """The printed text and the document it is."""
    code = config_main(["check", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, yaml.safe_load(out)


def test_check_masks_the_elasticsearch_password_of_the_file(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "opsloop.yaml"
    path.write_text(yaml.safe_dump({"audit": {"elasticsearch": {
        "hosts": ["https://es1.example:9200"], "username": "opsloop", "password": "file-s3cret-pw"}}}))
    out, doc = _check(path, capsys)
    es = doc["audit"]["elasticsearch"]
    assert "file-s3cret-pw" not in out
    assert es["password"] == "***"
    assert es["username"] == "opsloop" and es["hosts"] == ["https://es1.example:9200"]   # the rest as given


def test_check_masks_an_api_key_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OPSLOOP__AUDIT__ELASTICSEARCH__API_KEY", "env-api-key-s3cret")
    path = tmp_path / "opsloop.yaml"
    path.write_text(yaml.safe_dump({"audit": {"elasticsearch": {"hosts": ["https://es1.example:9200"]}}}))
    out, doc = _check(path, capsys)
    assert doc["audit"]["elasticsearch"]["api_key"] == "***"
    assert "env-api-key-s3cret" not in out


def test_check_shows_the_paths_of_secret_files_and_unset_secrets(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    key_file = tmp_path / "es-api-key"
    key_file.write_text("k")
    key_file.chmod(0o600)
    path = tmp_path / "opsloop.yaml"
    path.write_text(yaml.safe_dump({"audit": {"elasticsearch": {
        "hosts": ["https://es1.example:9200"], "api_key_file": str(key_file)}}}))
    _, doc = _check(path, capsys)
    es = doc["audit"]["elasticsearch"]
    assert es["api_key_file"] == str(key_file)   # a path is no secret: the operator checks it here
    assert es.get("password") is None and doc["kafka"]["security"]["password"] is None   # unset: said as unset
