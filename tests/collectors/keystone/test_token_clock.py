"""The probe's service token is reused until near its expiry. The expiry is Keystone's clock
(``expires_at``), compared with the collector host's wall clock: a host clock an hour or more ahead
of Keystone's took every token for expired at once, so every probe request issued a new token (a
token issue, password check included, per sample: load on the Keystone being measured)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from opsloop.collectors.keystone import Config, build
from opsloop.collectors.keystone import probe as probe_module
from tests.helpers import serve_http

LIFETIME_S = 3600


class FakeKeystone(BaseHTTPRequestHandler):
    """Issues tokens valid for an hour of its own clock (the real one), validates any."""

    issued = 0
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _reply(self, code: int, body: dict[str, object], headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(raw)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        FakeKeystone.issued += 1
        now = dt.datetime.now(dt.timezone.utc)
        iso = lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.000000Z")  # noqa: E731  Keystone's format
        self._reply(201, {"token": {"issued_at": iso(now), "expires_at": iso(now + dt.timedelta(seconds=LIFETIME_S))}},
                    {"X-Subject-Token": f"tok-{FakeKeystone.issued}"})

    def do_GET(self) -> None:
        self._reply(200, {"token": {}})


@pytest.fixture
def keystone(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for var, value in (("USERNAME", "probe"), ("PASSWORD", "pw"), ("PROJECT", "service")):
        monkeypatch.setenv(f"OPSLOOP_KEYSTONE_{var}", value)
    FakeKeystone.issued = 0
    with serve_http(FakeKeystone) as url:
        yield url


@pytest.mark.parametrize("offset_s", [0, 2 * LIFETIME_S, -2 * LIFETIME_S],
                         ids=["same clock", "host 2 h ahead", "host 2 h behind"])
def test_one_token_serves_every_probe_whatever_the_host_clock(keystone: str, offset_s: float,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    real = time.time
    monkeypatch.setattr(probe_module.time, "time", lambda: real() + offset_s)  # the host's wall clock only
    collector = build(Config(url=keystone, probes={"samples": 5}))
    for _ in range(3):
        r = collector.collect()
        assert r.errors == []
    [result] = [m for m in r.metrics if m.name == "keystone_probe"]
    assert result.fields["count"] == 5
    assert FakeKeystone.issued == 1, f"{FakeKeystone.issued} tokens issued for 15 probes"
