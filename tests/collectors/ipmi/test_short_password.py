"""A BMC password of 1-2 characters: scrub() cannot mask it (a substring mask would mangle the text and give
the password away), so it is refused when resolved, before ipmitool could print it anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.collectors.ipmi import Config, build
from opsloop.collectors.ipmi.config import resolve_hosts
from opsloop.collectors.ipmi.credentials import CredentialError, resolve_password, scrub


def _host(**kw: object):  # type: ignore[no-untyped-def]
    return resolve_hosts(Config(hosts=[{"name": "a", "bmc": "x", **kw}]))[0]


@pytest.mark.parametrize("secret", ["Z", "Zq"])
def test_a_one_or_two_character_password_is_refused_without_naming_it(
        secret: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSLOOP_TEST_SHORT_PW", secret)
    with pytest.raises(CredentialError, match="shorter than 3 characters") as e:
        resolve_password(_host(password_env="OPSLOOP_TEST_SHORT_PW"))
    assert "OPSLOOP_TEST_SHORT_PW" in str(e.value) and f" {secret} " not in f" {e.value} "
    pw = tmp_path / "pw"
    pw.write_text(secret + "\n")
    pw.chmod(0o600)
    with pytest.raises(CredentialError, match=f"password file {pw}: password shorter than 3"):
        resolve_password(_host(password_file=str(pw)))


def test_three_characters_and_the_empty_password_still_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSLOOP_TEST_PW3", "Zq7")
    assert resolve_password(_host(password_env="OPSLOOP_TEST_PW3")) == "Zq7"
    monkeypatch.setenv("OPSLOOP_TEST_PW0", "")   # anonymous BMC (some lab BMCs)
    assert resolve_password(_host(password_env="OPSLOOP_TEST_PW0")) == ""
    assert scrub("user opsloop password Zq7 rejected", "Zq7") == "user opsloop password *** rejected"


def test_a_short_password_never_reaches_ipmitool_or_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in ipmitool whose diagnostic quotes the password it was given (as a verbose or broken tool
    # may): before, scrub() left a 2-character password in the published error.
    ran = tmp_path / "ran"
    tool = tmp_path / "ipmitool"
    tool.write_text(f"#!/bin/bash\ntouch {ran}\necho \"login as opsloop/$IPMI_PASSWORD refused by BMC\" >&2\nexit 1\n")
    tool.chmod(0o755)
    monkeypatch.setenv("OPSLOOP_TEST_SHORT_PW", "Zq")
    collector = build(Config.model_validate({"hosts": [{"name": "short", "bmc": "127.0.0.1", "source": "dcmi",
                                                        "password_env": "OPSLOOP_TEST_SHORT_PW"}],
                                             "ipmitool": str(tool)}))
    rnd = collector.collect()
    [err] = rnd.errors
    assert "opsloop/Zq" not in err.message, err.message
    assert (err.target, err.kind) == ("short", "auth") and "shorter than 3 characters" in err.message
    assert not ran.exists()
    [bmc] = [m for m in rnd.metrics if m.name == "ipmi_bmc"]
    assert bmc.fields["up"] is False and bmc.fields["error_kind"] == "auth"
