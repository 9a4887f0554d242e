"""Keystone, or the uWSGI stats server, that answers a byte now and then without end (a wedged worker,
a proxy draining a huge reply). Each read is bounded by the timeout, the reply was not: the round never
ended, so the collector published nothing, for Keystone and every log it tails."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.collectors.keystone import Config, build
from tests.trickle import HTTP_200, ends_within, trickle_server

HEAD_201 = (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nX-Subject-Token: tok\r\n"
            b"Content-Length: 100000000\r\n\r\n")


@pytest.fixture
def probe_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSLOOP_KEYSTONE_USERNAME", "probe")
    monkeypatch.setenv("OPSLOOP_KEYSTONE_PASSWORD", "pw-never-shown")
    monkeypatch.setenv("OPSLOOP_KEYSTONE_PROJECT", "service")


def test_a_trickling_keystone_ends_the_probe_with_a_timeout(probe_credentials: None) -> None:
    with trickle_server(HEAD_201) as port:
        collector = build(Config(url=f"http://127.0.0.1:{port}", probes={"timeout_s": 0.5, "samples": 2}))
        r = ends_within(collector.collect)
    [err] = r.errors
    assert err.kind == "timeout" and err.target == f"http://127.0.0.1:{port}/v3/auth/tokens", err
    assert "pw-never-shown" not in err.message


@pytest.mark.parametrize("scheme", ["tcp", "http"])
def test_a_trickling_uwsgi_stats_server_is_a_timeout_and_the_rest_is_kept(scheme: str, tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text("uwsgi_req ts_ms=1795315485635 method=GET uri=/v3/x status=200 msecs=3 rsize=1 pid=1\n")
    with trickle_server(HTTP_200 if scheme == "http" else b"{") as port:
        address = f"http://127.0.0.1:{port}" if scheme == "http" else f"127.0.0.1:{port}"
        collector = build(Config(probes={"enabled": False}, uwsgi_stats=address, uwsgi_access_log=str(log),
                                 start_at="start", round_timeout_s=2))
        r = ends_within(collector.collect)
    [err] = r.errors
    assert err.kind == "timeout" and err.target == address and "uWSGI stats" in err.message, err
    assert [m.fields["parsed"] for m in r.metrics if m.name == "keystone_logfile"] == [1.0]  # the log still read
