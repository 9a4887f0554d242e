"""Alerts Alertmanager rejects as invalid, against the real Alertmanager of the tests (Debian's 0.25).

Before, what Alertmanager refused was lost: a 400 was counted (``opsloop_paging_alerts_dropped_total``),
logged and marked delivered, so on-call never heard of the finding; a 422 (a ``generatorURL`` it cannot
parse) was taken for an outage, and the whole batch holding the alert was retried for ever. What the
book built and Alertmanager refused:

* ``startsAt`` after ``endsAt`` (400): a finding stamped by a producer's clock ahead of ours (by up to
  the 300 s the book takes) cleared with ``endsAt`` = now, or opened with ``endsAt`` = now + ttl short
  of its start; ours stepping back did the same.
* a ``generatorURL`` that is no URI to Go (422): a finding's own dashboard link with a ``%`` that starts
  no escape (a ``dashboard_base_url`` without its scheme, which did it to every alert, is refused by the
  config: ``test_a_link_base_without_a_scheme_is_refused_by_the_config``).
* a start before the year 1000 (400): strftime wrote the year in fewer than four digits. Such a finding is
  no finding any more (``first_seen``/``last_seen`` from 1970 to 9999): dead-lettered at decode.
* label names it refuses (400): the mapping makes where-keys valid names, but a state file written
  before that (or edited) still holds them; such an alert now pages as its fallback, ``OpsloopPageRejected``.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from pydantic import ValidationError

from opsloop.controllers.paging.alertmanager import AlertmanagerClient, AlertmanagerError, PostResult
from opsloop.controllers.paging.book import OpenAlert, Outgoing, PagingBook, PendingResolve
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.mapping import Links, annotations_for, generator_url, iso, labels_for
from opsloop.controllers.paging.service import PagingService
from opsloop.records import Finding, Severity
from opsloop.stack import ManagedProcess
from tests.alerting import WebhookReceiver, am_url
from tests.controllers.paging.test_unit import LABEL_NAME, T0, finding
from tests.helpers import SentRecords, unique, wait_until

REPLACED = "opsloop_paging_alerts_replaced_total"
DROPPED = "opsloop_paging_alerts_dropped_total"
AHEAD_S = 120.0   # a producer's clock this far ahead of ours: inside the 300 s the book takes


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def page(hv: str, first_seen: float | None = None, last_seen: float | None = None, cleared: bool = False,
         where: dict[str, str] | None = None, dashboard: str = "") -> Finding:
    now = time.time()
    first = now if first_seen is None else first_seen
    return Finding(detector="firewall.unprotected_port", what="VM port without its security-group chain",
                   where=where or {"hypervisor": hv, "vm": "web-1", "port": "p1"}, observed="chain absent",
                   expected="chain present", severity=Severity.CRITICAL, explanation="test finding",
                   first_seen=first, last_seen=first if last_seen is None else last_seen, cleared=cleared,
                   dashboard=dashboard)


def am_alerts(am: ManagedProcess, **labels: str) -> list[dict[str, Any]]:
    """The alerts Alertmanager holds active (a resolved one is not listed)."""
    r = requests.get(f"{am_url(am)}/api/v2/alerts", params={"filter": [f'{k}="{v}"' for k, v in labels.items()]},
                     timeout=5)
    r.raise_for_status()
    return r.json()


def notified(webhook: WebhookReceiver, finding_id: str, status: str) -> list[Any]:
    return [d for d in webhook.at("/page") if d.body.get("status") == status
            and any(a["labels"].get("finding_id") == finding_id for a in d.body.get("alerts", []))]


@pytest.fixture
def services(tmp_path: Path, test_alertmanager: ManagedProcess) -> Iterator[Any]:
    """Paging services (in this process: the counters are ours to read) posting to the real Alertmanager."""
    made: list[PagingService] = []

    def make(producer: SentRecords | None = None, **paging: Any) -> PagingService:
        cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest", **paging)
        svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=producer,  # type: ignore[arg-type]
                            client=AlertmanagerClient([am_url(test_alertmanager)]))
        svc.auditor.producer = producer
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


# -- prevented at the source: the alert reaches Alertmanager as itself ----------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("resend_interval_s", [60.0, 10.0], ids=["resolve-ended-before-its-start",
                                                                 "firing-ended-before-its-start"])
def test_a_finding_stamped_ahead_of_our_clock_pages_and_resolves(services, test_alertmanager,
                                                                 resend_interval_s: float) -> None:
    """ttl 240 s: the page went out, its resolve (endsAt now, startsAt 120 s on) was refused and the page stayed
    open until it expired; ttl 40 s: the page itself (endsAt 40 s on) was refused and lost."""
    svc = services(resend_interval_s=resend_interval_s)
    hv = unique("hv-ahead")
    now = time.time()
    ahead = now + AHEAD_S
    dropped = counter(DROPPED)
    svc.handle_records([page(hv, first_seen=ahead).encode()], now)
    assert svc.deliver(now) == 1
    alerts = am_alerts(test_alertmanager, hypervisor=hv)
    assert [a["labels"]["alertname"] for a in alerts] == ["FirewallUnprotectedPort"], "the page was lost"
    assert ts(alerts[0]["startsAt"]) <= now + 0.001 < ts(alerts[0]["endsAt"])
    assert alerts[0]["annotations"]["first_seen"] == iso(ahead)      # the producer's stamp, as it was
    later = time.time()
    svc.handle_records([page(hv, first_seen=ahead, last_seen=ahead + 1, cleared=True).encode()], later)
    assert svc.deliver(later) == 1
    assert am_alerts(test_alertmanager, hypervisor=hv) == [], "the page stayed open after its finding cleared"
    assert counter(DROPPED) == dropped


@pytest.mark.integration
@pytest.mark.parametrize("bad", [
    pytest.param({"dashboard": "https://grafana.example/d/cpu-100%/hosts"}, id="link-with-a-bare-percent"),
])
def test_a_finding_alertmanager_refused_pages_as_itself_with_the_rest_of_its_batch(
        services, test_alertmanager, bad: dict[str, Any]) -> None:
    """A 422 (the link) had the whole batch retried for ever, the other page of it included."""
    svc = services(**bad.get("config", {}))
    hv, other = unique("hv-refused"), unique("hv-other")
    now = time.time()
    f = page(hv, dashboard=bad.get("dashboard", ""))
    svc.handle_records([f.encode(), page(other).encode()], now)
    assert svc.deliver(now) == 2
    assert am_alerts(test_alertmanager, hypervisor=other), "the other page of the batch was held back"
    alerts = am_alerts(test_alertmanager, hypervisor=hv)
    assert [a["labels"]["alertname"] for a in alerts] == ["FirewallUnprotectedPort"], "the page was lost"
    ann = alerts[0]["annotations"]
    assert ann["dashboard_url"] == annotations_for(f, svc.book.links)["dashboard_url"]   # the link as given
    later = time.time()
    svc.handle_records([page(hv, first_seen=f.first_seen, last_seen=now + 1, cleared=True,
                             dashboard=bad.get("dashboard", "")).encode()], later)
    svc.deliver(later)
    assert am_alerts(test_alertmanager, hypervisor=hv) == []


def stamped(f: Finding, **times: float) -> bytes:
    """``f`` on the wire with other times: a producer that no longer builds such a record can still send one."""
    return orjson.dumps({**orjson.loads(f.encode()), **times})


OUT_OF_RANGE = [pytest.param({"first_seen": -6e10}, id="started-before-the-year-1000"),
                pytest.param({"first_seen": -1.0}, id="started-before-1970"),
                pytest.param({"first_seen": 1.7e12, "last_seen": 1.7e12}, id="in-milliseconds"),
                pytest.param({"last_seen": 2.6e11}, id="last-seen-after-9999")]


@pytest.mark.integration
@pytest.mark.parametrize("times", OUT_OF_RANGE)
def test_a_finding_stamped_outside_1970_to_9999_is_dead_lettered_and_the_rest_still_pages(
        services, test_alertmanager, times: dict[str, float]) -> None:
    """Before: a finding from before 1970 (-6e10: the year 68) was paged, as starting then; now no such record
    is a finding (``Finding`` refuses it, naming the field): dead-lettered and counted, and the good findings
    of its batch and after it page."""
    producer = SentRecords()
    svc = services(producer=producer)
    hv, other, later_hv = unique("hv-stamped"), unique("hv-other"), unique("hv-later")
    now = time.time()
    bad = stamped(page(hv), **times)
    rejected = counter("opsloop_paging_rejected_records_total")
    actions = svc.handle_records([bad, page(other).encode()], now, [(0, 41, b"k41"), (0, 42, b"k42")])
    assert [a.labels["hypervisor"] for a in actions] == [other]
    assert counter("opsloop_paging_rejected_records_total") - rejected == 1
    dls = [orjson.loads(v) for topic, _, v in producer.records if topic == "telemetry.deadletter"]
    assert [(d["offset"], d["stage"]) for d in dls] == [(41, "paging")]
    field = next(iter(times))
    assert f"finding: {field}: " in dls[0]["reason"] and "from 1970 to the end of 9999" in dls[0]["reason"]
    assert orjson.loads(dls[0]["value"]) == orjson.loads(bad)   # kept as it came, for inspection
    assert svc.deliver(now) == 1
    assert am_alerts(test_alertmanager, hypervisor=other) and am_alerts(test_alertmanager, hypervisor=hv) == []
    assert not svc.book.open.keys() - {page(other).id}
    later = time.time()
    svc.handle_records([page(later_hv).encode()], later)
    assert svc.deliver(later) == 1 and am_alerts(test_alertmanager, hypervisor=later_hv), "paging stalled"


@pytest.mark.parametrize("field", ["dashboard_base_url", "runbook_base_url"])
def test_a_link_base_without_a_scheme_is_refused_by_the_config(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every alert's links start with it: without a scheme Alertmanager refused each alert's generatorURL. From
    the environment (read by opsloop.runbooks for the detectors too) a bad base is logged and the default used."""
    with pytest.raises(ValidationError, match=f"{field}(.|\n)*must start with http"):
        PagingConfig(**{field: "grafana.corp"})
    monkeypatch.setenv(f"OPSLOOP_{field.upper()}", "grafana.corp")
    assert getattr(PagingConfig(), field).startswith(("http://", "https://"))
    assert generator_url("grafana.corp/d/x") == "" and generator_url("https://grafana.corp/d/x") != ""


@pytest.mark.integration
def test_a_422_rejects_the_one_alert_and_is_no_outage(test_alertmanager) -> None:
    hv, now = unique("hv-422"), time.time()

    def alert(name: str, url: str) -> dict[str, Any]:
        return {"labels": {"alertname": name, "hypervisor": hv}, "annotations": {}, "startsAt": iso(now),
                "endsAt": iso(now + 60), "generatorURL": url}

    client = AlertmanagerClient([am_url(test_alertmanager)])
    try:
        result = client.post([alert("OpsloopTestGood", "http://grafana:3000/d"),
                              alert("OpsloopTestBadLink", "http://grafana:port/d")])
    finally:
        client.close()
    assert result.accepted == 1
    assert [(a["labels"]["alertname"], "generatorURL" in why) for a, why in result.rejected] == [
        ("OpsloopTestBadLink", True)]
    assert [a["labels"]["alertname"] for a in am_alerts(test_alertmanager, hypervisor=hv)] == ["OpsloopTestGood"]


# -- still refused: the fallback pages in its place ---------------------------------------------------
def port_id_finding(hv: str, **kw: Any) -> Finding:
    return page(hv, where={"hypervisor": hv, "vm": "web-1", "port-id": "p1"}, **kw)


def older_state(f: Finding) -> bytes:
    """The state file of a version whose mapping let the where-key ``port-id`` through as a label name."""
    labels = labels_for(f)
    labels["port-id"] = labels.pop("port_id")
    return orjson.dumps({"version": 1, "open": [{
        "finding_id": f.id, "labels": labels, "annotations": annotations_for(f, Links()), "starts_at": f.first_seen,
        "event_time": f.last_seen, "first_seen": f.first_seen, "last_seen": f.last_seen, "last_sent": None,
        "delivered_once": True}]})


@pytest.mark.integration
@pytest.mark.parametrize("restart", ["state-saved", "state-lost"])
def test_a_rejected_page_pages_as_its_fallback_and_resolves_with_its_finding(
        services, test_alertmanager, webhook: WebhookReceiver, tmp_path: Path, restart: str) -> None:
    """``state-lost``: a crash after the fallback was posted, before the state saying so was written: the
    restarted book resolves the alert as it was, Alertmanager refuses that too, and the fallback's resolve
    (the same labels: they derive from the refused alert) ends the fallback page."""
    hv = unique("hv-fallback")
    f = port_id_finding(hv)
    (tmp_path / "state.json").write_bytes(older_state(f))
    svc = services()
    svc.load_state()
    now = time.time()
    assert svc.deliver(now) == 1
    fallback = am_alerts(test_alertmanager, finding_id=f.id)
    assert [a["labels"] for a in fallback] == [{
        "alertname": "OpsloopPageRejected", "severity": "critical", "source": "opsloop-paging", "finding_id": f.id,
        "rejected_alertname": "FirewallUnprotectedPort", "signal": "firewall",
        "detector": "firewall.unprotected_port", "hypervisor": hv, "vm": "web-1", "port_id": "p1"}], \
        "the rejected page reached Alertmanager in no form"
    ann = fallback[0]["annotations"]
    assert "invalid name" in ann["rejection_reason"] and "port-id" in ann["rejection_reason"]
    assert ann["runbook_url"] == annotations_for(f, Links())["runbook_url"] and ann["finding_id"] == f.id
    assert ann["summary"].startswith("Alertmanager rejected the page FirewallUnprotectedPort of finding")
    assert am_alerts(test_alertmanager, hypervisor=hv, alertname="FirewallUnprotectedPort") == []
    wait_until(lambda: notified(webhook, f.id, "firing"), timeout=30, what="the fallback paging on-call")
    # re-sent as its fallback, not tried again as itself
    assert [a["labels"]["alertname"] for a in svc.book.due(now + 61)] == ["OpsloopPageRejected"]

    if restart == "state-saved":
        svc.save_state()
        assert orjson.loads((tmp_path / "state.json").read_bytes())["open"][0]["rejected"]
    svc.close()
    svc = services()
    svc.load_state()
    later = time.time()
    svc.handle_records([port_id_finding(hv, first_seen=f.first_seen, last_seen=f.last_seen + 1,
                                        cleared=True).encode()], later)
    assert svc.deliver(later) == 1
    assert am_alerts(test_alertmanager, finding_id=f.id) == [], "the fallback page stayed open after its clear"
    wait_until(lambda: notified(webhook, f.id, "resolved"), timeout=30, what="the fallback's resolve")


@pytest.mark.integration
def test_a_rejected_page_is_audited_and_counted_once(services, test_alertmanager, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    f = port_id_finding(unique("hv-audit"))
    (tmp_path / "state.json").write_bytes(older_state(f))
    producer = SentRecords()
    svc = services(producer=producer)
    svc.load_state()
    replaced, dropped = counter(REPLACED), counter(DROPPED)
    now = time.time()
    with caplog.at_level(logging.ERROR, logger="opsloop.paging"):
        svc.deliver(now)
        svc.deliver(now + 61)   # the re-send: the fallback, no second rejection
    assert counter(DROPPED) == dropped, "a rejected page counted as dropped"
    assert counter(REPLACED) - replaced == 1
    audits = [orjson.loads(v) for topic, _, v in producer.records if topic == "audit"]
    rejected = [a for a in audits if a["action"] == "page_rejected"]
    assert [(a["result"], a["labels"]["finding_id"], a["labels"]["alertname"]) for a in rejected] == [
        ("sent", f.id, "FirewallUnprotectedPort")]
    assert "port-id" in rejected[0]["reason"] and "OpsloopPageRejected sent in its place" in rejected[0]["reason"]
    lines = [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "alert_rejected"]
    assert [(line["finding_id"], line["replaced_by"]) for line in lines] == [(f.id, "OpsloopPageRejected")]


class RefusingAlertmanager:
    """Refuses every alert, as Alertmanager does an invalid one: the fallback too."""

    def __init__(self) -> None:
        self.bodies: list[list[dict[str, Any]]] = []

    def post(self, alerts: list[dict[str, Any]]) -> PostResult:
        self.bodies.append(alerts)
        return PostResult(rejected=[(a, '"refused for the test"') for a in alerts])

    def close(self) -> None:
        pass


def test_a_rejected_fallback_is_logged_audited_and_counted_as_lost(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    producer, client = SentRecords(), RefusingAlertmanager()
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest")
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=producer,  # type: ignore[arg-type]
                        client=client)  # type: ignore[arg-type]
    svc.auditor.producer = producer
    svc.handle_records([finding().encode()], T0)
    replaced, dropped = counter(REPLACED), counter(DROPPED)
    with caplog.at_level(logging.ERROR, logger="opsloop.paging"):
        svc.deliver(T0)
    assert [[a["labels"]["alertname"] for a in body] for body in client.bodies] == [
        ["FirewallUnprotectedPort"], ["OpsloopPageRejected"]]
    assert counter(REPLACED) - replaced == 1 and counter(DROPPED) - dropped == 1
    audits = [orjson.loads(v) for topic, _, v in producer.records if topic == "audit"]
    assert [(a["result"], a["labels"]["alertname"]) for a in audits if a["action"] == "page_rejected"] == [
        ("sent", "FirewallUnprotectedPort"), ("failed", "OpsloopPageRejected")]
    lines = [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "alert_rejected"]
    assert [(line["finding_id"], line.get("page_lost", False)) for line in lines] == [
        (finding().id, False), (finding().id, True)]
    # a lost page is neither audited as delivered nor timed as a page latency; it is tried again at the
    # re-send interval, not at once
    assert not [a for a in audits if a["action"] == "page_delivered"], "a lost page audited as delivered"
    assert not svc.book.open[finding().id].delivered_once
    svc.deliver(T0 + 1)
    assert len(client.bodies) == 2, "a lost page re-posted at once"
    svc.deliver(T0 + 61)
    # sent as its fallback, refused again: the same page, counted and audited lost once (test_lost_pages.py)
    assert len(client.bodies) == 3 and counter(DROPPED) - dropped == 1


# -- the fallback's labels ---------------------------------------------------------------------------
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(labels=st.dictionaries(names, st.text(max_size=300), max_size=40),
       severity=st.sampled_from(["critical", "warning", "", "page-now"]))
def test_the_fallback_of_any_label_set_is_valid_and_one_alert_firing_and_resolved(
        labels: dict[str, str], severity: str) -> None:
    labels = {**labels, "alertname": "Some-Alert", "severity": severity}
    book = PagingBook(alert_ttl_s=240)
    annotations = {"finding_id": "f1", "summary": "s"}
    book.open["f1"] = OpenAlert("f1", labels, annotations, T0, T0)
    book._queue_resolve(PendingResolve("f1", labels, annotations, T0, T0 + 10))
    resolve, firing = book.outgoing(T0 + 20)
    assert (resolve.resolve, firing.resolve) == (True, False)
    got = [book.rejected(a, "invalid label set", T0 + 20) for a in (firing, resolve)]
    assert got[0] is not None and got[1] is not None
    fb = got[0]["labels"]
    assert fb == got[1]["labels"]
    assert ts(got[1]["endsAt"]) == T0 + 10 < ts(got[0]["endsAt"])   # the resolve's fallback ends with it
    assert all(LABEL_NAME.match(k) for k in fb) and all(0 < len(v) <= 256 for v in fb.values())
    assert fb["alertname"] == "OpsloopPageRejected" and fb["finding_id"] == "f1"
    assert fb["severity"] == (severity if severity in ("critical", "warning") else "critical")
    assert len(fb) <= 27 and book.rejected(Outgoing(got[0], firing.record), "again", T0 + 20) is None
    # distinct names: no label of the refused alert lost to another that cleans to the same name
    kept = {k: v for k, v in labels.items() if k not in ("alertname", "severity", "source") and v}
    assert len(fb) - 5 == min(len(kept), 22)


# -- what counts as sent --------------------------------------------------------------------------------
def sent(state: str) -> float:
    return REGISTRY.get_sample_value("opsloop_paging_alerts_sent_total", {"state": state}) or 0.0


class PickyAlertmanager:
    """Refuses the alerts ``refuses`` picks (fallbacks included, when it picks them); ``down_after`` posts
    answered, the next raise as an outage does."""

    def __init__(self, refuses: Any, down_after: int = 1_000) -> None:
        self.refuses, self.down_after = refuses, down_after
        self.bodies: list[list[dict[str, Any]]] = []

    def post(self, alerts: list[dict[str, Any]]) -> PostResult:
        if len(self.bodies) >= self.down_after:
            raise AlertmanagerError("http://127.0.0.1:1: connection refused")
        self.bodies.append(alerts)
        refused = [(a, '"refused for the test"') for a in alerts if self.refuses(a)]
        return PostResult(accepted=len(alerts) - len(refused), rejected=refused)

    def close(self) -> None:
        pass


def picky_service(tmp_path: Path, client: PickyAlertmanager) -> PagingService:
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest")
    return PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=None, client=client)  # type: ignore[arg-type]


def one_of(hv: str) -> Any:
    return lambda a: a["labels"].get("hypervisor") == hv


@pytest.mark.parametrize("refuses", ["the-alert-and-its-fallback", "the-alert"])
def test_only_what_alertmanager_accepted_counts_as_sent(tmp_path: Path, refuses: str) -> None:
    """Before: every alert of the post counted as sent (firing, or resolved by the queue's length), refused
    ones included, and a fallback refused too (the page lost) as well."""
    bad, good = unique("hv-refused"), unique("hv-fine")
    svc = picky_service(tmp_path, PickyAlertmanager(
        one_of(bad) if refuses == "the-alert-and-its-fallback"
        else lambda a: one_of(bad)(a) and a["labels"]["alertname"] != "OpsloopPageRejected"))
    firing, resolved, dropped = sent("firing"), sent("resolved"), counter(DROPPED)
    svc.handle_records([page(bad, first_seen=T0).encode(), page(good, first_seen=T0).encode()], T0)
    accepted = 1 if refuses == "the-alert-and-its-fallback" else 2   # the fallback, when it went in
    assert svc.deliver(T0) == accepted
    assert (sent("firing") - firing, counter(DROPPED) - dropped) == (accepted, 2 - accepted)
    svc.handle_records([page(h, first_seen=T0, last_seen=T0 + 1, cleared=True).encode() for h in (bad, good)], T0 + 1)
    assert svc.deliver(T0 + 1) == accepted
    assert sent("resolved") - resolved == accepted and sent("firing") - firing == accepted


def test_alerts_accepted_before_the_fallback_post_failed_count_as_sent(tmp_path: Path) -> None:
    """Alertmanager took the good alert, then went away before the fallback's post: the good one was delivered
    (before, nothing was counted); the fallback is tried again with the next post and counted once accepted."""
    bad, good = unique("hv-refused"), unique("hv-fine")
    client = PickyAlertmanager(lambda a: one_of(bad)(a) and a["labels"]["alertname"] != "OpsloopPageRejected",
                               down_after=1)
    svc = picky_service(tmp_path, client)
    firing = sent("firing")
    svc.handle_records([page(bad, first_seen=T0).encode(), page(good, first_seen=T0).encode()], T0)
    assert svc.deliver(T0) == 1 and sent("firing") - firing == 1
    client.down_after = 1_000
    assert svc.deliver(T0 + svc.backoff.wait(T0)) == 2 and sent("firing") - firing == 3
    assert [a["labels"]["alertname"] for a in client.bodies[-1]] == ["OpsloopPageRejected", "FirewallUnprotectedPort"]
