"""Config validation and probe-credential loading (secrets never appear in errors or reprs)."""

from __future__ import annotations


import pytest
import yaml
from pydantic import ValidationError

from opsloop.collectors.keystone import Config, build
from opsloop.collectors.keystone.credentials import CredentialsError, load
from opsloop.collect.types import Collector
from tests.helpers import REPO

SAMPLE = REPO / "collectors" / "keystone" / "sample.yaml"


def test_sample_yaml_is_a_valid_config_and_builds_a_collector():
    section = yaml.safe_load(SAMPLE.read_text())["collectors"]["keystone"]
    cfg = Config.model_validate(section)
    assert cfg.frontend.small_request_bytes == 65536 and cfg.uwsgi_stats == "127.0.0.1:1717"
    collector = build(cfg)
    assert isinstance(collector, Collector) and collector.name == "keystone"
    collector.close()


@pytest.mark.parametrize("section, field", [
    ({"url": "keystone:5000"}, "url"),
    ({"url": "http://k:5000/v3"}, "url"),
    ({"url": "http://admin:pw@k:5000"}, "url"),
    ({"probes": {"samples": 0}}, "probes.samples"),
    ({"probes": {"timeout_s": -1}}, "probes.timeout_s"),
    ({"probes": {"password": "x"}}, "probes.password"),
    ({"frontend": {"top_credentials": 0}}, "frontend.top_credentials"),
    ({"start_at": "middle"}, "start_at"),
    ({"bogus": 1}, "bogus"),
])
def test_validation_errors_name_the_field(section, field):
    with pytest.raises(ValidationError) as e:
        Config.model_validate(section)
    locs = {".".join(map(str, err["loc"])) for err in e.value.errors()}
    assert field in locs


def test_nothing_to_collect_is_refused():
    with pytest.raises(ValidationError, match="nothing to collect"):
        Config.model_validate({"probes": {"enabled": False}})


def test_url_password_is_not_echoed():
    with pytest.raises(ValidationError) as e:
        Config.model_validate({"url": "http://admin:hunter2@k:5000"})
    assert "credentials" in str(e.value)


def test_credentials_from_file_with_env_override(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"username": "probe", "password": "file-pw", "project": "service",
                                 "ec2_access": "AK", "ec2_secret": "file-secret"}))
    creds = load(f, "T_KS_", {"T_KS_PASSWORD": "env-pw"})
    assert creds.username == "probe" and creds.password.get_secret_value() == "env-pw"
    assert creds.ec2_secret is not None and creds.ec2_secret.get_secret_value() == "file-secret"
    assert "env-pw" not in repr(creds) and "file-secret" not in repr(creds)


def test_credentials_from_env_only():
    creds = load(None, "T_KS_", {"T_KS_USERNAME": "u", "T_KS_PASSWORD": "p", "T_KS_PROJECT": "service"})
    assert creds.ec2_access is None and creds.user_domain == "Default"


def test_missing_fields_are_named_without_values(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"username": "probe", "password": "s3cr3t-value"}))
    with pytest.raises(CredentialsError) as e:
        load(f, "T_KS_", {})
    assert "project" in str(e.value) and "s3cr3t-value" not in str(e.value)


def test_half_an_ec2_pair_is_refused():
    with pytest.raises(CredentialsError, match="go together"):
        load(None, "T_KS_", {"T_KS_USERNAME": "u", "T_KS_PASSWORD": "p", "T_KS_PROJECT": "s",
                             "T_KS_EC2_SECRET": "only-secret"})


def test_broken_yaml_does_not_quote_the_secret(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("username: u\npassword: [unclosed s3cr3t\n")
    with pytest.raises(CredentialsError) as e:
        load(f, "T_KS_", {})
    assert "not valid YAML" in str(e.value) and "s3cr3t" not in str(e.value)


def test_unreadable_credentials_file_is_named(tmp_path):
    with pytest.raises(CredentialsError, match="nope.yaml"):
        load(tmp_path / "nope.yaml", "T_KS_", {})
