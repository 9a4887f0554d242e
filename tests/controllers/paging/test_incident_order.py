"""Incidents of one finding id whose records arrive out of their stamps' order: two detector workers after a
rebalance (the old owner's clear of incident A arrives after, or is stamped after, the new owner's start of
incident B), or a producer's clock stepped back while A was open.

Before, B (``first_seen`` after A's) was ignored while its ``last_seen`` was before A's clear: a short B never
paged. And A's clear arriving after B's start resolved B's page. Incidents are told apart by ``first_seen``:
a record of an incident that started after the one cleared is new whatever the clear's stamp; a clear of an
incident that started before the open one ends that older incident only; the cleared incident's own records
stay stale.
"""

from __future__ import annotations

import time

import pytest

from opsloop.controllers.paging.book import PagingBook
from opsloop.records import Finding, Severity
from opsloop.stack import ManagedProcess
from tests.controllers.paging.test_rejected_pages import am_alerts, page, services  # noqa: F401 - a fixture
from tests.helpers import unique

T0 = 1_795_310_400.0


def rec(first_seen: float, last_seen: float, cleared: bool = False) -> Finding:
    return Finding(detector="edge.fail_static", what="edge weights held (fail static)",
                   where={"listener": "web", "edge": "ams1"}, severity=Severity.CRITICAL,
                   first_seen=first_seen, last_seen=last_seen, cleared=cleared)


def kinds(book: PagingBook, f: Finding, now: float = T0 + 200) -> list[str]:
    out = [a.kind for a in book.apply(f, now)]
    book.delivered(now)
    return out


# A opened at T0; its clear stamped T0 + 100 (the old owner's clock ahead, or the clear sent late); B, the
# next incident, started at T0 + 50 by the new owner
A_OPEN, A_LATER, A_CLEAR = rec(T0, T0), rec(T0, T0 + 20), rec(T0, T0 + 100, cleared=True)
B_OPEN, B_LATER, B_CLEAR = rec(T0 + 50, T0 + 50), rec(T0 + 50, T0 + 60), rec(T0 + 50, T0 + 70, cleared=True)


def test_a_new_incident_stamped_before_the_previous_clear_pages_and_resolves() -> None:
    b = PagingBook()
    assert kinds(b, A_OPEN) == ["open"] and kinds(b, A_CLEAR) == ["resolve"]
    assert kinds(b, B_OPEN) == ["open"], "the new incident was ignored: its last_seen is before the clear's"
    for stale in (A_OPEN, A_LATER, A_CLEAR):   # the cleared incident's records, again: still stale
        assert kinds(b, stale) == ["ignore"], stale
    assert kinds(b, B_LATER) == ["refresh"]
    assert [a.first_seen for a in b.open.values()] == [B_OPEN.first_seen] and b.pending_resolves() == 0
    assert kinds(b, B_CLEAR) == ["resolve"] and b.open == {}
    for stale in (A_OPEN, B_OPEN, B_LATER, A_CLEAR):
        assert kinds(b, stale) == ["ignore"], stale


def test_the_older_incidents_clear_arriving_after_the_new_one_started_leaves_its_page() -> None:
    b = PagingBook()
    assert kinds(b, A_OPEN) == ["open"]
    assert kinds(b, B_OPEN) == ["refresh"]          # the same alert: B carries it on
    assert kinds(b, A_CLEAR) == ["ignore"], "A's clear resolved B's page"
    assert [a.first_seen for a in b.open.values()] == [B_OPEN.first_seen] and b.pending_resolves() == 0
    assert kinds(b, A_LATER) == ["ignore"]          # A is over: its records never come back
    assert kinds(b, B_LATER) == ["refresh"]
    assert kinds(b, B_CLEAR) == ["resolve"] and b.open == {}


def test_the_clear_of_a_new_incident_never_seen_open_is_sent_and_its_late_records_ignored() -> None:
    b = PagingBook()
    kinds(b, A_OPEN)
    kinds(b, A_CLEAR)
    assert kinds(b, B_CLEAR) == ["resolve"]         # not open here: its resolve is still sent once
    assert kinds(b, B_OPEN) == ["ignore"] and b.open == {}


def test_the_rule_survives_a_restart() -> None:
    b = PagingBook()
    kinds(b, A_OPEN)
    kinds(b, A_CLEAR)
    restored = PagingBook()
    restored.restore(b.to_dict())
    assert kinds(restored, A_LATER) == ["ignore"] and kinds(restored, B_OPEN) == ["open"]


# -- through the service, against the real Alertmanager ----------------------------------------------------
def hv_page(hv: str, first_seen: float, last_seen: float, cleared: bool = False) -> bytes:
    return page(hv, first_seen=first_seen, last_seen=last_seen, cleared=cleared).encode()


@pytest.mark.integration
def test_the_new_incident_pages_in_alertmanager(services, test_alertmanager: ManagedProcess) -> None:
    svc = services()
    hv = unique("hv-order")
    t = time.time() - 200   # the stamps below stay in the past
    svc.handle_records([hv_page(hv, t, t)], time.time())
    assert svc.deliver(time.time()) == 1
    svc.handle_records([hv_page(hv, t, t + 150, cleared=True)], time.time())
    svc.deliver(time.time())
    assert am_alerts(test_alertmanager, hypervisor=hv) == []
    svc.handle_records([hv_page(hv, t + 50, t + 60)], time.time())
    assert svc.deliver(time.time()) == 1
    assert len(am_alerts(test_alertmanager, hypervisor=hv)) == 1, "the new incident did not page"
    svc.handle_records([hv_page(hv, t, t + 20), hv_page(hv, t + 50, t + 70, cleared=True)], time.time())
    svc.deliver(time.time())
    assert am_alerts(test_alertmanager, hypervisor=hv) == []


@pytest.mark.integration
def test_a_late_clear_of_the_older_incident_leaves_the_page_in_alertmanager(
        services, test_alertmanager: ManagedProcess) -> None:
    svc = services()
    hv = unique("hv-late-clear")
    t = time.time() - 200
    svc.handle_records([hv_page(hv, t, t), hv_page(hv, t + 50, t + 60)], time.time())
    assert svc.deliver(time.time()) == 1
    svc.handle_records([hv_page(hv, t, t + 150, cleared=True)], time.time())
    svc.deliver(time.time())
    assert len(am_alerts(test_alertmanager, hypervisor=hv)) == 1, "the older incident's clear resolved the page"
    svc.handle_records([hv_page(hv, t + 50, t + 70, cleared=True)], time.time())
    assert svc.deliver(time.time()) == 1
    assert am_alerts(test_alertmanager, hypervisor=hv) == []
