"""The Keystone collector against a real Keystone 30 under uWSGI, and a real nginx S3 front end."""

from __future__ import annotations

import os
import time

import pytest
import requests
import yaml

from opsloop.collectors.keystone import Config, build
from opsloop.lab.keystone_server import KeystoneAdmin, provision_probe_user, s3_load, write_credentials_file
from tests.collectors.keystone.lab import keystone_lab  # noqa: F401  (session fixture)
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def by_name(metrics, name):
    return [m for m in metrics if m.name == name]


def probe_fields(round_, probe):
    [m] = [m for m in by_name(round_.metrics, "keystone_probe") if m.tags["probe"] == probe]
    return m.fields


def live_config(lab, **over):
    base = dict(host="keystone-test", url=lab.keystone.url,
                probes={"credentials_file": str(lab.credentials_file), "samples": 5, "timeout_s": 30},
                uwsgi_stats=lab.keystone.stats_address, uwsgi_access_log=str(lab.keystone.access_log),
                frontend={"access_logs": [str(lab.frontend.access_log)]})
    base.update(over)
    return Config.model_validate(base)


def test_probes_stats_and_access_log_from_the_real_server(keystone_lab):
    collector = build(live_config(keystone_lab, probes={"credentials_file": str(keystone_lab.credentials_file),
                                                       "samples": 4, "timeout_s": 30}))
    r = collector.collect()
    assert not r.errors, r.errors
    for probe in ("token_validate", "s3_signature"):
        f = probe_fields(r, probe)
        assert f["count"] == 4 and f["errors"] == 0 and 0 < f["p50_ms"] <= f["p95_ms"] <= f["max_ms"]
    server = by_name(r.metrics, "uwsgi_server")[0]
    workers = by_name(r.metrics, "uwsgi_worker")
    assert server.fields["workers"] == len(workers) == 2
    assert server.fields["requests"] == sum(w.fields["requests"] for w in workers) > 0
    # the probes' own requests show up in the access-log aggregation, per endpoint. uWSGI writes a request's
    # log line after the response has gone out, so the last probe of a round may land in the next round's
    # read: round 2's probes are counted over rounds 2 and 3 (the first read starts at the end of the log).
    r2, r3 = collector.collect(), collector.collect()
    endpoints: dict[tuple[str, str], dict[str, float]] = {}
    for m in by_name(r2.metrics, "keystone_requests") + by_name(r3.metrics, "keystone_requests"):
        acc = endpoints.setdefault((m.tags["method"], m.tags["endpoint"]), {"count": 0.0, "status_2xx": 0.0})
        acc["count"] += m.fields["count"]
        acc["status_2xx"] += m.fields["status_2xx"]
    assert endpoints[("GET", "/v3/auth/tokens")]["count"] >= 4
    assert endpoints[("POST", "/v3/s3tokens")]["count"] >= 4
    assert endpoints[("POST", "/v3/s3tokens")]["status_2xx"] >= 4
    stats2 = by_name(r2.metrics, "uwsgi_server")[0]
    assert stats2.fields["requests"] > server.fields["requests"]
    collector.close()


def test_two_regimes_token_caching_on_vs_off(keystone_lab, tmp_path):
    """Validation ~10 ms with Keystone's token cache, hundreds of ms without ("RadosGW/Keystone Integration
    Performance Issues—Finally Solved?", "Boosting OpenStack's Parallel Performance").
    Compared as a ratio measured in this test, never as absolute times."""
    ks = keystone_lab.keystone
    creds = yaml.safe_load(keystone_lab.credentials_file.read_text())
    token_only = tmp_path / "token-only.yaml"  # no EC2 pair: only the token-validation probe runs
    token_only.write_text(yaml.safe_dump({k: creds[k] for k in ("username", "password", "project")}))
    cfg = live_config(keystone_lab, probes={"credentials_file": str(token_only), "samples": 3, "timeout_s": 60},
                      frontend={"access_logs": []}, uwsgi_access_log=None)
    try:
        ks.set_caching(True)
        enabled = build(cfg)
        enabled.collect()                      # warm-up: first requests of fresh workers fill the cache
        on = enabled.collect()
        ks.set_caching(False)
        off = build(cfg).collect()
    finally:
        ks.set_caching(True)
    assert not on.errors and not off.errors, (on.errors, off.errors)
    on_p50, off_p50 = probe_fields(on, "token_validate")["p50_ms"], probe_fields(off, "token_validate")["p50_ms"]
    assert off_p50 >= 5 * on_p50, (on_p50, off_p50)
    # the server side sees the same regimes: uWSGI's average response time per worker
    on_rt = max(w.fields["avg_rt_ms"] for w in by_name(on.metrics, "uwsgi_worker"))
    off_rt = max(w.fields["avg_rt_ms"] for w in by_name(off.metrics, "uwsgi_worker"))
    assert off_rt > on_rt


def test_load_from_several_credentials_heaviest_on_top(keystone_lab):
    keys = keystone_lab.s3_keys
    plan = [(keys[0].access, keys[0].secret, 6), (keys[1].access, keys[1].secret, 20),
            (keys[2].access, keys[2].secret, 3), (keys[3].access, keys[3].secret, 10)]
    collector = build(live_config(keystone_lab, probes={"enabled": False}))
    log = keystone_lab.frontend.access_log
    before = log.read_text().count("\n")
    ks_log = keystone_lab.keystone.access_log
    s3tokens_before = ks_log.read_text().count("uri=/v3/s3tokens ")
    statuses = s3_load(keystone_lab.frontend.url, plan, concurrency=4)
    assert statuses == [200] * 39  # every signature was accepted by the real Keystone
    # nginx writes a log line when it finalizes the request, just after the client got its answer
    wait_until(lambda: log.read_text().count("\n") - before >= 39, timeout=30, what="nginx to log 39 lines")
    wait_until(lambda: ks_log.read_text().count("uri=/v3/s3tokens ") - s3tokens_before >= 39, timeout=30,
               what="uWSGI to log 39 s3tokens calls")
    r = collector.collect()
    assert not r.errors, r.errors
    creds = by_name(r.metrics, "s3_frontend_credential")
    assert [(m.tags["access_key"], m.fields["requests"]) for m in creds] == [
        (keys[1].access, 20), (keys[3].access, 10), (keys[0].access, 6), (keys[2].access, 3)]
    assert [m.fields["rank"] for m in creds] == [1, 2, 3, 4]
    assert creds[0].fields["share"] == pytest.approx(20 / 39)
    total = by_name(r.metrics, "s3_frontend_requests")[0]
    assert total.fields["keystone_validations"] == 39 and total.fields["small_requests"] == 39
    # each front-end request cost Keystone one s3tokens validation, visible in uWSGI's log
    s3tokens = [m for m in by_name(r.metrics, "keystone_requests") if m.tags["endpoint"] == "/v3/s3tokens"]
    assert s3tokens and s3tokens[0].fields["count"] >= 39
    collector.close()


def test_wrong_password_is_a_401_auth_error(keystone_lab, tmp_path):
    creds = yaml.safe_load(keystone_lab.credentials_file.read_text())
    creds["password"] = "definitely-wrong-pw"
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(creds))
    r = build(live_config(keystone_lab, probes={"credentials_file": str(f)}, uwsgi_access_log=None,
                          frontend={"access_logs": []})).collect()
    [err] = r.errors
    assert err.kind == "auth" and "401" in err.message and "service credentials" in err.message
    assert "definitely-wrong-pw" not in err.message and creds["ec2_secret"] not in err.message
    assert by_name(r.metrics, "uwsgi_server")  # the rest of the round still happened


def test_invalid_service_token_is_a_401_and_is_reissued(keystone_lab):
    """A service token Keystone no longer accepts (here: one it cannot decrypt; a revoked one behaves the
    same once every worker's cache has forgotten it — dogpile.cache.memory is per uWSGI worker, so a revocation
    is not seen at once by the other workers) gives an auth error naming the 401, then a fresh token."""
    cfg = live_config(keystone_lab, probes={"credentials_file": str(keystone_lab.credentials_file), "samples": 2,
                                            "timeout_s": 30}, uwsgi_access_log=None, frontend={"access_logs": []})
    collector = build(cfg)
    assert not collector.collect().errors
    good = collector.prober.service_token()
    bogus = "gAAAAA" + good[6:-8][::-1] + good[-8:]  # same shape, not decryptable with the server's keys
    collector.prober._token = bogus
    r = collector.collect()
    assert any(e.kind == "auth" and "rejected the probe's service token (401" in e.message for e in r.errors)
    assert all(bogus not in e.message and good not in e.message for e in r.errors)
    assert probe_fields(r, "token_validate")["errors"] >= 1
    assert not collector.collect().errors  # a fresh token was issued
    assert collector.prober.service_token() not in (bogus, good)
    collector.close()


def test_service_token_without_service_role_is_a_403_on_s3tokens(keystone_lab, tmp_path):
    admin = KeystoneAdmin(keystone_lab.keystone.url, keystone_lab.keystone.admin)
    member = provision_probe_user(admin, role="member", username="probe-without-service-role")
    f = write_credentials_file(tmp_path / "member.yaml", member)
    assert oct(os.stat(f).st_mode & 0o777) == "0o600"
    r = build(live_config(keystone_lab, probes={"credentials_file": str(f), "samples": 2, "timeout_s": 30},
                          uwsgi_access_log=None, frontend={"access_logs": []})).collect()
    s3_errors = [e for e in r.errors if e.target.endswith("/v3/s3tokens")]
    assert len(s3_errors) == 1 and s3_errors[0].kind == "auth"
    assert "403" in s3_errors[0].message and "service or admin role" in s3_errors[0].message
    assert probe_fields(r, "s3_signature")["errors"] == 2
    errs = [m for m in by_name(r.metrics, "keystone_probe_errors") if m.tags["probe"] == "s3_signature"]
    assert errs[0].tags["status"] == "403" and errs[0].fields["count"] == 2


def wait_for_log_to_settle(path, quiet_s: float = 1.0) -> None:
    """Until ``path`` has not grown for ``quiet_s`` and ends on a complete line. uWSGI writes a
    request's log line after the response has gone out, so the previous test's last request can
    land in the log after the next test has started reading it (a stray POST /v3/s3tokens, the
    403 of the test before, counted in this one's first round on a loaded machine)."""
    seen = {"size": -1, "since": 0.0}

    def quiet() -> bool:
        size = path.stat().st_size
        if size != seen["size"]:
            seen.update(size=size, since=time.monotonic())
            return False
        with open(path, "rb") as f:  # its last byte only: the log grows over the module
            f.seek(max(size - 1, 0))
            whole = size == 0 or f.read(1) == b"\n"
        return whole and time.monotonic() - seen["since"] >= quiet_s

    wait_until(quiet, timeout=30, interval=0.2, what=f"{path.name} to settle")


def test_access_log_copytruncate_rotation_on_the_real_uwsgi(keystone_lab):
    ks = keystone_lab.keystone
    wait_for_log_to_settle(ks.access_log)  # no earlier test's request lands in our first round
    cfg = live_config(keystone_lab, probes={"enabled": False}, uwsgi_stats=None, frontend={"access_logs": []})
    collector = build(cfg)
    start = ks.access_log.stat().st_size
    session = requests.Session()
    for _ in range(3):
        assert session.get(f"{ks.url}/v3", timeout=30).status_code == 200

    def logged_since_start() -> str:
        return ks.access_log.read_bytes()[start:].decode()

    # Each worker writes its own lines: wait for all three of ours, not just for a complete last line.
    wait_until(lambda: logged_since_start().count("uri=/v3 ") >= 3 and logged_since_start().endswith("\n"),
               timeout=30, what="uWSGI to log the three requests")
    first = collector.collect()
    assert {(m.tags["endpoint"], m.fields["count"]) for m in by_name(first.metrics, "keystone_requests")} == {
        ("/v3", 3)}
    rotated = ks.copytruncate_access_log()
    assert rotated.read_text().count("uri=/v3 ") >= 3
    for _ in range(4):
        assert session.get(f"{ks.url}/v3/auth/tokens", timeout=30).status_code == 401
    wait_until(lambda: ks.access_log.read_text().count("uri=/v3/auth/tokens ") >= 4
               and ks.access_log.read_text().endswith("\n"), timeout=30,
               what="uWSGI to log the new requests")
    r = collector.collect()
    logfile = by_name(r.metrics, "keystone_logfile")[0]
    assert logfile.fields["truncations"] == 1 and logfile.fields["unparsed"] == 0
    endpoints = {(m.tags["method"], m.tags["endpoint"]): m.fields for m in by_name(r.metrics, "keystone_requests")}
    assert set(endpoints) == {("GET", "/v3/auth/tokens")}
    assert endpoints[("GET", "/v3/auth/tokens")]["count"] == 4 and endpoints[("GET", "/v3/auth/tokens")][
        "status_4xx"] == 4
    collector.close()
