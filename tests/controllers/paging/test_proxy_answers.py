"""Answers from a proxy in front of Alertmanager (a ``serve_http`` stand-in forwarding to the real one) that
sending the same body again cannot fix.

Before:

* 413 (the body over the proxy's limit, nginx: 1 MiB by default) was taken for an outage: the batch was
  retried whole, with back-off, for ever, and every page behind it waited (250 alerts of a few KiB already
  make 1 MiB). One alert too large alone stalled every page.
* a captive proxy's 200 (an HTML page) counted the alerts delivered: they never reached Alertmanager.
* a 302 (a URL moved) was followed as a GET, which Alertmanager answers 200 with its alert list: the alerts
  counted delivered, never posted.
* a 429's Retry-After was not heeded: retried at the back-off's first 0.5 s.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
import requests

from opsloop.controllers.paging import metrics
from opsloop.controllers.paging.alertmanager import MAX_POST_BYTES, AlertmanagerClient
from opsloop.controllers.paging.book import PagingBook
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.mapping import FALLBACK_ALERTNAME
from opsloop.controllers.paging.service import PagingService
from opsloop.records import Finding, Severity
from opsloop.stack import ManagedProcess
from tests.alerting import am_url
from tests.helpers import SentRecords, serve_http, unique

pytestmark = pytest.mark.integration


@dataclass
class Proxy:
    """What the stand-in proxy does with each POST; what it saw."""
    upstream: str
    limit: int | None = None                 # 413 for a body over this many bytes
    answer: tuple[int, dict[str, str], bytes] | None = None   # a canned answer instead of forwarding
    statuses: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def seen(self, status: int) -> int:
        with self.lock:
            return self.statuses.count(status)


@pytest.fixture
def proxy(test_alertmanager: ManagedProcess) -> Iterator[tuple[Proxy, str]]:
    state = Proxy(am_url(test_alertmanager))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if state.answer is not None:
                status, headers, reply = state.answer
            elif state.limit is not None and len(body) > state.limit:
                status, headers, reply = 413, {"Content-Type": "text/html"}, (
                    b"<html><head><title>413 Request Entity Too Large</title></head></html>")
            else:
                r = requests.post(state.upstream + self.path, data=body,
                                  headers={"Content-Type": "application/json"}, timeout=10)
                status, headers, reply = r.status_code, {}, r.content
            with state.lock:
                state.statuses.append(status)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    with serve_http(Handler) as url:
        yield state, url


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Any]:
    made: list[PagingService] = []

    def make(url: str, producer: SentRecords | None = None, **paging: Any) -> PagingService:
        cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest", **paging)
        svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=producer,  # type: ignore[arg-type]
                            client=AlertmanagerClient([url]))
        svc.auditor.producer = producer
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


def page(hv: str, vm: str, explanation: str = "test finding", what: str = "VM port without its chain") -> Finding:
    now = time.time()
    return Finding(detector="firewall.unprotected_port", what=what, where={"hypervisor": hv, "vm": vm},
                   observed="chain absent", expected="chain present", severity=Severity.CRITICAL,
                   explanation=explanation, first_seen=now, last_seen=now)


def am_alerts(am: ManagedProcess, hv: str) -> list[dict[str, Any]]:
    r = requests.get(f"{am_url(am)}/api/v2/alerts", params={"filter": f'hypervisor="{hv}"'}, timeout=5)
    r.raise_for_status()
    return r.json()


def failures() -> float:
    return metrics.DELIVERY_FAILURES._value.get()


# -- 413: a body over the proxy's limit -----------------------------------------------------------------
def test_a_batch_over_the_proxys_limit_is_split_and_every_page_goes_out(proxy, service, test_alertmanager) -> None:
    state, url = proxy
    state.limit = 64 * 1024
    hv = unique("hv-413-batch")
    svc = service(url)
    now = time.time()
    # 40 alerts of about 6 KiB (long explanations): 240 KiB in one body, over the limit
    svc.handle_records([page(hv, f"vm-{i}", explanation="x" * 2000 + str(i)).encode() for i in range(40)], now)
    assert svc.deliver(now) == 40, "the batch was refused whole (413) and retried whole: no page went out"
    assert state.seen(413) >= 1
    assert len(am_alerts(test_alertmanager, hv)) == 40
    assert svc.book.pending(now + 1) == 0


def test_one_alert_too_large_alone_pages_as_its_short_fallback_and_the_others_go_out(
        proxy, service, test_alertmanager) -> None:
    state, url = proxy
    state.limit = 6 * 1024
    hv = unique("hv-413-one")
    producer = SentRecords()
    svc = service(url, producer=producer)
    replaced = metrics.REPLACED._value.get()
    now = time.time()
    big = page(hv, "vm-big", explanation="y" * 2000, what="w" * 2000)   # description, summary, what: ~8 KiB
    svc.handle_records([page(hv, f"vm-{i}").encode() for i in range(3)] + [big.encode()], now)
    assert svc.deliver(now) == 4, "one alert too large stalled every page behind it"
    got = {a["labels"]["vm"]: a for a in am_alerts(test_alertmanager, hv)}
    assert sorted(got) == ["vm-0", "vm-1", "vm-2", "vm-big"]
    fb = got["vm-big"]
    assert fb["labels"]["alertname"] == FALLBACK_ALERTNAME and fb["labels"]["finding_id"] == big.id
    assert fb["annotations"]["rejection_reason"].startswith("HTTP 413 (payload too large")
    assert all(len(v) <= 256 for k, v in fb["annotations"].items() if not k.endswith("_url"))
    assert metrics.REPLACED._value.get() - replaced == 1
    rejected = [(key, orjson.loads(v)) for topic, key, v in producer.records if topic == "audit"
                and orjson.loads(v)["action"] == "page_rejected"]
    assert [(key, "413" in a["reason"]) for key, a in rejected] == [(big.id.encode(), True)]
    # re-sent (as the fallback, as it is) at the re-send interval: no 413 again
    before = state.seen(413)
    assert svc.deliver(now + 61) == 4
    assert state.seen(413) == before


def test_a_body_never_reaches_nginx_default_limit(proxy, service, test_alertmanager) -> None:
    state, url = proxy
    state.limit = 1024 * 1024
    hv = unique("hv-1mib")
    svc = service(url)
    now = time.time()
    # 250 alerts (one post's worth by count) of about 6 KiB: 1.5 MiB
    svc.handle_records([page(hv, f"vm-{i}", explanation="z" * 2000 + str(i)).encode() for i in range(250)], now)
    assert svc.deliver(now) == 250
    assert state.seen(413) == 0 and state.seen(200) >= 3


def test_an_alert_built_from_the_longest_finding_fits_a_post() -> None:
    """Every text of a finding as long as it may be, each character one JSON escapes: still one post's worth."""
    now = time.time()
    long_text = "\U0001F600\x01" * 50_000
    f = Finding(detector="firewall." + "d" * 500, what=long_text, observed=long_text, expected=long_text,
                explanation=long_text, severity=Severity.CRITICAL, first_seen=now, last_seen=now,
                where={f"k{i}-\x01": "\x01" * 1024 for i in range(30)}, dashboard="https://g/" + "a" * 5000,
                runbook="runbooks/" + "r" * 5000)
    book = PagingBook()
    book.apply(f, now)
    (out,) = book.outgoing(now)
    assert len(orjson.dumps([out.alert])) < MAX_POST_BYTES // 2
    fallback = book.rejected(out, "HTTP 400: " + "e" * 1000, now)
    assert fallback is not None and len(orjson.dumps([fallback])) < MAX_POST_BYTES // 2


# -- answers that are not Alertmanager's ----------------------------------------------------------------
@pytest.mark.parametrize("answer", [
    (200, {"Content-Type": "text/html"}, b"<html><body>Please accept the terms of use</body></html>"),
    # the GET lists no alert (the shared Alertmanager's list is over the 1 MiB a reply may have)
    (302, {"Location": '{am}/api/v2/alerts?filter=alertname="none-such"'}, b""),
    (301, {"Location": '{am}/api/v2/alerts?filter=alertname="none-such"'}, b""),
], ids=["captive-proxy-200-html", "302-to-alertmanager", "301-to-alertmanager"])
def test_an_answer_that_is_not_alertmanagers_is_no_delivery(proxy, service, test_alertmanager, caplog,
                                                           answer) -> None:
    state, url = proxy
    status, headers, body = answer
    state.answer = (status, {k: v.format(am=state.upstream) for k, v in headers.items()}, body)
    hv = unique(f"hv-{status}")
    svc = service(url, backoff_initial_s=0.5, backoff_max_s=1.0)
    now = time.time()
    svc.handle_records([page(hv, "vm-1").encode()], now)
    before = failures()
    with caplog.at_level(logging.WARNING, logger="opsloop.paging"):
        assert svc.deliver(now) == 0, "counted delivered, never posted to Alertmanager"
    assert failures() - before == 1
    assert am_alerts(test_alertmanager, hv) == []
    (line,) = [str(getattr(r, "fields", {})) for r in caplog.records if r.getMessage() == "alertmanager_unreachable"]
    assert ("not Alertmanager's" in line) if status == 200 else ("set alertmanager_urls" in line), line
    # the page is held: delivered once the proxy forwards again
    state.answer = None
    later = now + svc.backoff.wait(now) + 0.01
    assert svc.deliver(later) == 1
    assert len(am_alerts(test_alertmanager, hv)) == 1


def test_a_307_keeps_the_post_and_delivers(proxy, service, test_alertmanager) -> None:
    state, url = proxy
    state.answer = (307, {"Location": f"{state.upstream}/api/v2/alerts"}, b"")
    hv = unique("hv-307")
    svc = service(url)
    now = time.time()
    svc.handle_records([page(hv, "vm-1").encode()], now)
    assert svc.deliver(now) == 1
    assert len(am_alerts(test_alertmanager, hv)) == 1


# -- answers for every request: retried, said clearly -----------------------------------------------------
def test_a_429_retry_after_is_heeded_up_to_the_back_off_cap(proxy, service) -> None:
    state, url = proxy
    state.answer = (429, {"Retry-After": "20"}, b"slow down")
    svc = service(url, backoff_initial_s=0.5, backoff_max_s=60.0)
    now = time.time()
    svc.handle_records([page(unique("hv-429"), "vm-1").encode()], now)
    assert svc.deliver(now) == 0
    assert svc.backoff.wait(now) >= 20.0, "retried at the back-off's 0.5 s, not after the Retry-After"
    state.answer = (429, {}, b"slow down")   # without one: the back-off alone
    svc.backoff.succeeded()
    assert svc.deliver(now) == 0
    assert svc.backoff.wait(now) <= 0.5


@pytest.mark.parametrize("status, hint", [(401, "credentials"), (403, "credentials"), (404, "without /api/v2")])
def test_a_refusal_of_every_request_is_said_with_its_cause_and_no_credential(proxy, service, caplog,
                                                                              status: int, hint: str) -> None:
    state, url = proxy
    state.answer = (status, {"Content-Type": "text/plain"}, b"no")
    svc = service(url.replace("http://", "http://pager:s3cr3t-pw@"))
    now = time.time()
    svc.handle_records([page(unique(f"hv-{status}"), "vm-1").encode()], now)
    before = failures()
    with caplog.at_level(logging.WARNING, logger="opsloop.paging"):
        assert svc.deliver(now) == 0
    assert failures() - before == 1   # OpsloopPagingDeliveryFailing: failures with alerts pending
    assert svc.book.pending(now) == 1
    (line,) = [str(getattr(r, "fields", {})) for r in caplog.records if r.getMessage() == "alertmanager_unreachable"]
    assert f"HTTP {status}" in line and hint in line, line
    assert "s3cr3t-pw" not in line
