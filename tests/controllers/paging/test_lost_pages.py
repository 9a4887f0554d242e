"""A page lost (Alertmanager refused the alert and its ``OpsloopPageRejected`` fallback) counts once.

Before, a lost page was tried again at every re-send interval and counted lost again at every try
(``opsloop_paging_alerts_dropped_total``, audit ``page_rejected`` ``failed``): one page refused five times
read as five lost pages on the dashboard and in ``OpsloopPagingAlertsDropped``; its resolve, refused too,
counted once more; and a later try that got through said nothing. Lost pages were also told by finding id:
the refused resolve of a severity's old labels marked the new severity's page, accepted in the same post, as
not delivered (no ``page_delivered`` audit, no latency).

The pages lost right now are a gauge (``opsloop_paging_pages_lost``): the counter's increase, which
``OpsloopPagingAlertsDropped`` fires on, ended 15 min after the loss while the page was still refused at every
re-send, and nothing said the page still reached nobody (``OpsloopPagingPageStillLost`` fires on the gauge).

Against the real Alertmanager of the tests, behind a proxy that answers 400 to the alerts of the finding
under test (the runbook's "a proxy in front of it answering 400/422": it refuses the fallback too).
"""

from __future__ import annotations

import logging
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import pytest
import requests

from opsloop.controllers.paging import metrics
from opsloop.controllers.paging.alertmanager import AlertmanagerClient
from opsloop.controllers.paging.book import Outgoing, PagingBook, PendingResolve
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from opsloop.records import Severity
from opsloop.stack import ManagedProcess
from tests.alerting import WebhookReceiver, am_url
from tests.controllers.paging.test_rejected_pages import DROPPED, am_alerts, counter, notified, page
from tests.controllers.paging.test_unit import T0, finding
from tests.helpers import SentRecords, serve_http, unique, wait_until

Refuses = Callable[[dict[str, Any]], bool]
PAGES_LOST = "opsloop_paging_pages_lost"


class Proxy:
    """Forwards ``POST /api/v2/alerts`` to Alertmanager; a body holding an alert ``refuses`` picks is answered
    400, as Alertmanager answers an invalid alert (the client then posts that body alert by alert)."""

    def __init__(self) -> None:
        self.refuses: Refuses = lambda alert: False
        self.refused: list[dict[str, Any]] = []


@pytest.fixture
def proxy(test_alertmanager: ManagedProcess) -> Iterator[tuple[Proxy, str]]:
    state, upstream = Proxy(), am_url(test_alertmanager)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            picked = [a for a in orjson.loads(body) if state.refuses(a)]
            if picked:
                state.refused += picked
                status, reply = 400, b'{"code":400,"message":"refused by the proxy for the test"}'
            else:
                r = requests.post(upstream + self.path, data=body, headers={"Content-Type": "application/json"},
                                  timeout=5)
                status, reply = r.status_code, r.content
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    with serve_http(Handler) as url:
        yield state, url


@pytest.fixture
def service(tmp_path: Path, proxy: tuple[Proxy, str]) -> Iterator[Callable[[SentRecords], PagingService]]:
    made: list[PagingService] = []

    def make(producer: SentRecords) -> PagingService:
        cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest", resend_interval_s=60)
        svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=producer,  # type: ignore[arg-type]
                            client=AlertmanagerClient([proxy[1]]))
        svc.auditor.producer = producer
        svc.load_state()
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


def of(hv: str) -> Refuses:
    return lambda alert: alert["labels"].get("hypervisor") == hv


def audits(producer: SentRecords, action: str) -> list[dict[str, Any]]:
    return [a for a in (orjson.loads(v) for topic, _, v in producer.records if topic == "audit")
            if a["action"] == action]


def lines(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == event]


@pytest.mark.integration
def test_a_lost_page_counts_once_is_tried_again_and_is_delivered_late(
        service, proxy, test_alertmanager, webhook: WebhookReceiver, caplog: pytest.LogCaptureFixture) -> None:
    state, _ = proxy
    hv = unique("hv-lost")
    f = page(hv)
    state.refuses = of(hv)
    producer = SentRecords()
    svc = service(producer)
    dropped = counter(DROPPED)
    t = time.time()
    with caplog.at_level(logging.WARNING, logger="opsloop.paging"):
        svc.handle_records([f.encode()], t)
        assert svc.deliver(t) == 0
        assert [a["labels"]["alertname"] for a in state.refused] == ["FirewallUnprotectedPort", "OpsloopPageRejected"]
        for k in (1, 2):   # the re-sends, refused again
            assert svc.deliver(t + 61 * k) == 0
        svc.save_state()
        svc.close()
        svc = service(producer)   # a restart: the mark is in the state file, the page is tried at once
        assert svc.deliver(t + 150) == 0
        assert len(state.refused) == 5, "a lost page was not tried again"
        assert counter(DROPPED) - dropped == 1, "one lost page counted at every try"
        assert [(x["result"], x["labels"]["alertname"]) for x in audits(producer, "page_rejected")] == [
            ("sent", "FirewallUnprotectedPort"), ("failed", "OpsloopPageRejected")]
        assert am_alerts(test_alertmanager, hypervisor=hv) == []

        state.refuses = lambda alert: False   # the proxy is fixed: the next try gets through
        assert svc.deliver(t + 150 + 61) == 1
    fired = am_alerts(test_alertmanager, hypervisor=hv)
    assert [a["labels"]["alertname"] for a in fired] == ["OpsloopPageRejected"]   # still as its fallback
    wait_until(lambda: notified(webhook, f.id, "firing"), timeout=30, what="the late page reaching on-call")
    rejected = lines(caplog, "alert_rejected")
    assert [(x["page_lost"], x["counted"], x["tries"]) for x in rejected if x.get("page_lost")] == [
        (True, True, 1), (True, False, 2), (True, False, 3), (True, False, 4)]
    [late] = lines(caplog, "page_delivered_late")
    assert (late["finding_id"], late["refused_tries"], late["lost_for_s"]) == (f.id, 4, pytest.approx(211, abs=1))
    [delivered] = audits(producer, "page_delivered")
    assert delivered["labels"]["finding_id"] == f.id and "late: lost since" in delivered["reason"]
    assert "4 posts of it and its fallback refused" in delivered["reason"]
    assert counter(DROPPED) - dropped == 1

    later = time.time()
    svc.handle_records([page(hv, first_seen=f.first_seen, last_seen=later, cleared=True).encode()], later)
    assert svc.deliver(later) == 1
    assert am_alerts(test_alertmanager, hypervisor=hv) == [], "the late page stayed open after its clear"


@pytest.mark.integration
def test_a_lost_page_cleared_while_still_refused_counts_once(service, proxy, test_alertmanager) -> None:
    """Its resolve (the fallback's) is refused too: the page is lost, not twice."""
    state, _ = proxy
    hv = unique("hv-lost-cleared")
    f = page(hv)
    state.refuses = of(hv)
    producer = SentRecords()
    svc = service(producer)
    dropped = counter(DROPPED)
    t = time.time()
    svc.handle_records([f.encode()], t)
    svc.deliver(t)
    svc.deliver(t + 61)
    svc.handle_records([page(hv, first_seen=f.first_seen, last_seen=t + 1, cleared=True).encode()], t + 62)
    assert svc.deliver(t + 62) == 0 and svc.book.pending_resolves() == 0   # its resolve sent (and refused)
    assert [a["labels"]["alertname"] for a in state.refused[-2:]] == ["OpsloopPageRejected"] * 2
    assert counter(DROPPED) - dropped == 1
    assert [x["result"] for x in audits(producer, "page_rejected")] == ["sent", "failed"]


@pytest.mark.integration
def test_a_lost_resolve_of_the_old_severity_leaves_the_new_page_delivered(service, proxy, test_alertmanager) -> None:
    """Both alerts of a severity change go in one post; the old one's resolve is refused with its fallback.
    Lost pages were told by finding id: the new page, accepted, was taken for lost too."""
    state, _ = proxy
    hv = unique("hv-severity")
    t = time.time()
    warning = page(hv, first_seen=t)
    warning = warning.model_copy(update={"severity": Severity.WARNING})
    critical = warning.model_copy(update={"severity": Severity.CRITICAL, "last_seen": t + 1})
    producer = SentRecords()
    svc = service(producer)
    svc.handle_records([warning.encode()], t)
    assert svc.deliver(t) == 1
    state.refuses = lambda alert: of(hv)(alert) and alert["labels"]["severity"] == "warning"
    dropped = counter(DROPPED)
    svc.handle_records([critical.encode()], t + 1)
    assert svc.deliver(t + 1) == 1
    # the old alert ends at its endsAt instead: its resolve was lost, which counts (that page was delivered)
    assert sorted(a["labels"]["severity"] for a in am_alerts(test_alertmanager, hypervisor=hv)) == [
        "critical", "warning"]
    assert counter(DROPPED) - dropped == 1
    assert [x["labels"]["severity"] for x in audits(producer, "page_delivered")] == ["warning", "critical"], \
        "the new severity's page, accepted, was not audited as delivered"
    [alert] = svc.book.open.values()
    assert alert.delivered_once and alert.lost_at is None


@pytest.mark.integration
def test_the_lost_pages_gauge_stays_up_while_the_page_is_refused_and_drops_when_it_gets_through(
        service, proxy, test_alertmanager, webhook: WebhookReceiver) -> None:
    state, _ = proxy
    hv = unique("hv-still-lost")
    f = page(hv)
    state.refuses = of(hv)
    producer = SentRecords()
    svc = service(producer)
    t = time.time()
    svc.handle_records([f.encode()], t)
    assert svc.deliver(t) == 0
    assert counter(PAGES_LOST) == 1, "a lost page is not in the gauge"
    for k in (1, 2, 3):   # re-sends refused again: counted lost once, still lost at each
        assert svc.deliver(t + 61 * k) == 0
        assert counter(PAGES_LOST) == 1, f"the page was still refused at re-send {k}"
    assert svc.deliver(t + 61 * 3 + 1) == 0 and counter(PAGES_LOST) == 1   # a step with nothing due
    svc.save_state()
    svc.close()
    metrics.PAGES_LOST.set(0)   # a new process starts at 0: the restored mark sets it again
    svc = service(producer)
    assert counter(PAGES_LOST) == 1, "a restart exports 0 until its first delivery step (it may wait for Kafka)"
    assert svc.deliver(t + 200) == 0 and counter(PAGES_LOST) == 1, "a restart forgot the page still lost"

    state.refuses = lambda alert: False   # the proxy is fixed: the next try gets through
    assert svc.deliver(t + 200 + 61) == 1
    assert counter(PAGES_LOST) == 0, "a page delivered late still counts as lost"
    wait_until(lambda: notified(webhook, f.id, "firing"), timeout=30, what="the late page reaching on-call")


@pytest.mark.integration
def test_the_lost_pages_gauge_drops_when_the_lost_page_is_cleared(service, proxy, test_alertmanager) -> None:
    """Its resolve is refused too (not tried again): nothing open is lost any more."""
    state, _ = proxy
    hv, other = unique("hv-still-lost-cleared"), unique("hv-still-paged")
    f = page(hv)
    state.refuses = of(hv)
    svc = service(SentRecords())
    t = time.time()
    svc.handle_records([f.encode(), page(other).encode()], t)
    assert svc.deliver(t) == 1                      # the other page went out: not lost
    assert counter(PAGES_LOST) == 1
    assert svc.deliver(t + 61) == 1 and counter(PAGES_LOST) == 1
    svc.handle_records([page(hv, first_seen=f.first_seen, last_seen=t + 1, cleared=True).encode()], t + 62)
    assert svc.deliver(t + 62) == 0 and svc.book.pending_resolves() == 0   # its resolve sent (and refused)
    assert counter(PAGES_LOST) == 0, "a page cleared while lost still counts as lost"
    assert [a["labels"]["hypervisor"] for a in am_alerts(test_alertmanager, hypervisor=other)] == [other]


# -- the book ------------------------------------------------------------------------------------------
def test_the_book_counts_the_open_pages_lost_now_across_a_restart() -> None:
    b = PagingBook(resend_interval_s=60)
    b.apply(finding(), T0)
    b.apply(finding(hypervisor="hv-9"), T0)
    outs = b.outgoing(T0)
    lost = next(o for o in outs if o.alert["labels"]["hypervisor"] == "hv-3")
    b.lost(lost, T0)
    b.delivered(T0, [lost.record])
    assert b.lost_pages() == 1
    restored = PagingBook(resend_interval_s=60)
    restored.restore(orjson.loads(orjson.dumps(b.to_dict())))
    assert restored.lost_pages() == 1
    [again] = [o for o in restored.outgoing(T0 + 5) if o.alert["labels"]["hypervisor"] == "hv-3"]
    assert restored.lost(again, T0 + 5) is False and restored.lost_pages() == 1
    restored.delivered(T0 + 5, [again.record])
    restored.apply(finding(cleared=True, last_seen=T0 + 6), T0 + 6)
    assert restored.lost_pages() == 0


def test_the_book_counts_a_page_lost_once_until_delivered_and_again_after() -> None:
    b = PagingBook(resend_interval_s=60)
    b.apply(finding(), T0)
    [out] = b.outgoing(T0)
    assert b.lost(out, T0) is True
    b.delivered(T0, [out.record])
    assert b.outgoing(T0 + 1) == []   # tried again at the re-send interval, not at once
    [out] = b.outgoing(T0 + 60)
    assert b.lost(out, T0 + 60) is False
    done = b.delivered(T0 + 60, [out.record])
    assert done.first == [] and done.late == []
    done = b.delivered(T0 + 120)
    assert [(x.alert.finding_id, x.lost_at, x.tries) for x in done.late] == [(finding().id, T0, 2)]
    assert [a.finding_id for a in done.first] == [finding().id]
    [out] = b.outgoing(T0 + 180)   # delivered, then lost again: a page lost again counts again
    assert b.lost(out, T0 + 180) is True


def test_the_resolve_of_a_lost_page_does_not_count_again_and_the_mark_survives_a_restart() -> None:
    b = PagingBook(resend_interval_s=60)
    b.apply(finding(), T0)
    b.apply(finding(hypervisor="hv-9"), T0)
    outs = b.outgoing(T0)
    lost = next(o for o in outs if o.alert["labels"]["hypervisor"] == "hv-3")
    assert b.lost(lost, T0)
    b.delivered(T0, [lost.record])
    doc = orjson.loads(orjson.dumps(b.to_dict()))
    by_id = {e["finding_id"]: e for e in doc["open"]}
    assert (by_id[finding().id]["lost_at"], by_id[finding().id]["lost_tries"]) == (T0, 1)
    assert "lost_at" not in by_id[finding(hypervisor="hv-9").id]   # written only when set: older versions load it
    restored = PagingBook(resend_interval_s=60)
    restored.restore(doc)
    [again] = [o for o in restored.outgoing(T0 + 5) if o.alert["labels"]["hypervisor"] == "hv-3"]
    assert restored.lost(again, T0 + 5) is False, "a restart counted the lost page again"
    restored.apply(finding(cleared=True, last_seen=T0 + 6), T0 + 6)
    [resolve] = [o for o in restored.outgoing(T0 + 6) if o.resolve]
    assert isinstance(resolve.record, PendingResolve) and resolve.record.page_lost
    assert restored.lost(resolve, T0 + 6) is False
    assert PagingBook().lost(Outgoing({}, PendingResolve("x", {}, {}, T0, T0)), T0) is True   # a paged one's: counts


@pytest.mark.parametrize("entry", [{"lost_at": "yesterday"}, {"lost_at": -1e13}, {"lost_tries": -1},
                                   {"lost_tries": True}, {"lost_tries": 1.5}])
def test_a_saved_lost_mark_of_the_wrong_type_is_refused_by_name(entry: dict[str, Any]) -> None:
    b = PagingBook()
    b.apply(finding(), T0)
    doc = orjson.loads(orjson.dumps(b.to_dict()))
    doc["open"][0].update(entry)
    with pytest.raises(ValueError, match=f"open\\[0\\].*{next(iter(entry))}"):
        PagingBook().restore(doc)


def test_a_saved_page_lost_flag_that_is_no_boolean_is_refused_by_name() -> None:
    doc = {"version": 1, "resolves": [{"finding_id": "x", "labels": {}, "annotations": {}, "starts_at": T0,
                                       "ends_at": T0, "page_lost": "yes"}]}
    with pytest.raises(ValueError, match=r"resolves\[0\].*page_lost"):
        PagingBook().restore(doc)
