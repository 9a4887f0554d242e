"""A resolve delivered is re-sent for ``resend_resolved_s`` (15 min), as Prometheus re-sends resolved alerts
(``resolvedRetention`` in prometheus/notifier).

Before, a clear's resolve was posted once and forgotten. Alertmanager keeps alerts in memory only: one restarted
after it took the resolve and before its group's next flush (``group_interval``) came back without the alert,
its notification log (``--storage.path``) still saying the page was sent firing, and never sent the resolve: the
receiver's incident (PagerDuty's) stayed open for good. The same for a cluster peer that never got the resolve.

Against the real Alertmanager (Debian's 0.25) restarted on its storage; the book's rules (an alert open again
within the retention is never resolved by a late re-send, a clock stepped back never re-opens it, the state file,
the bound) on the book itself.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest

from opsloop.controllers.paging import metrics
from opsloop.controllers.paging.alertmanager import AlertmanagerClient, PostResult
from opsloop.controllers.paging.amconfig import write_alertmanager_config
from opsloop.controllers.paging.book import Outgoing, PagingBook
from opsloop.controllers.paging.config import PagingConfig, PagingConfigError, paging_config
from opsloop.controllers.paging.mapping import fallback_labels, labels_for
from opsloop.controllers.paging.service import PagingService
from opsloop.config import Settings
from opsloop.records import Finding
from opsloop.stack import ManagedProcess, free_port
from opsloop.stack.components import alertmanager
from tests.alerting import ROUTING_KEY, WebhookReceiver
from tests.controllers.paging.test_rejected_pages import page
from tests.controllers.paging.test_unit import T0, finding, ts
from tests.helpers import unique, wait_until

RESENT = 900.0   # the default: Prometheus' resolvedRetention


def start_am(workdir: Path, webhook: WebhookReceiver, port: int) -> ManagedProcess:
    """Our alertmanager.yml with a 10 min group_interval: a resolve taken after the page waits that long for its
    notification, so a restart before it is certain, not a race. Its storage (notification log) is kept in
    ``workdir`` across restarts, as a production Alertmanager's ``--storage.path``."""
    workdir.mkdir(parents=True, exist_ok=True)
    key = workdir / "routing-key"
    key.write_text(ROUTING_KEY)
    cfg = write_alertmanager_config(workdir / "alertmanager.yml", webhook_url=webhook.url, routing_key_file=key,
                                    timings={"group_wait": "1s", "group_interval": "10m", "repeat_interval": "1h"})
    am = alertmanager(workdir, "127.0.0.1", port, config=cfg)
    am.start()
    return am


@pytest.fixture
def restartable_am(tmp_path: Path, webhook: WebhookReceiver) -> Iterator[dict[str, Any]]:
    port = free_port()
    held: dict[str, Any] = {"am": start_am(tmp_path / "am", webhook, port), "port": port}

    def restart() -> None:
        held["am"].stop()   # SIGTERM: the notification log is written to its storage; the alerts are gone
        held["am"] = start_am(tmp_path / "am", webhook, port)

    held["restart"] = restart
    try:
        yield held
    finally:
        held["am"].stop()


def resolved_at_receiver(webhook: WebhookReceiver, hv: str) -> list[Any]:
    return [d for d in webhook.at("/page") if d.body.get("status") == "resolved"
            and any(a["labels"].get("hypervisor") == hv for a in d.body.get("alerts", []))]


def firing_at_receiver(webhook: WebhookReceiver, hv: str) -> list[Any]:
    return [d for d in webhook.at("/page") if d.body.get("status") == "firing"
            and any(a["labels"].get("hypervisor") == hv for a in d.body.get("alerts", []))]


def sent_resolved() -> float:
    return metrics.SENT.labels("resolved")._value.get()


@pytest.mark.integration
def test_a_resolve_an_alertmanager_restart_lost_reaches_the_receiver(
        tmp_path: Path, restartable_am: dict[str, Any], webhook: WebhookReceiver) -> None:
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest", resend_interval_s=60)
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=None,  # type: ignore[arg-type]
                        client=AlertmanagerClient([f"http://127.0.0.1:{restartable_am['port']}"]))
    try:
        hv = unique("hv-am-restart")
        opened = page(hv)
        svc.handle_records([opened.encode()], time.time())
        assert svc.deliver(time.time()) == 1
        wait_until(lambda: firing_at_receiver(webhook, hv), timeout=60, what="the page at the receiver")
        t = time.time()
        svc.handle_records([page(hv, first_seen=opened.first_seen, last_seen=t, cleared=True).encode()], t)
        assert svc.deliver(t) == 1   # Alertmanager took the resolve; it notifies it at the group's next flush
        restartable_am["restart"]()  # ... which never comes: restarted before it
        assert resolved_at_receiver(webhook, hv) == []

        # a re-send interval later the resolve goes again, with its own endsAt: the restarted Alertmanager's
        # notification log says the page went out firing, so it notifies the resolve
        sent = sent_resolved()
        assert svc.deliver(t + 60) == 1 and sent_resolved() - sent == 1
        got = wait_until(lambda: resolved_at_receiver(webhook, hv), timeout=30, what="the resolve at the receiver")
        assert ts(got[0].body["alerts"][0]["endsAt"]) == pytest.approx(t, abs=0.01)
        assert len(firing_at_receiver(webhook, hv)) == 1   # no second page

        # re-sent every interval until 15 min past its endsAt, then no more
        assert [svc.deliver(t + 60 * k) for k in range(2, 16)] == [1] * 13 + [0]
        assert svc.book.due(t + RESENT + 3600) == [] and svc.book.resolved == {}
    finally:
        svc.close()


# -- the book's rules ---------------------------------------------------------------------------------------
def book(**kw: Any) -> PagingBook:
    return PagingBook(resend_interval_s=60, alert_ttl_s=240, **kw)


def resolved_once(b: PagingBook, f: Finding = finding(), at: float = T0 + 10) -> dict[str, Any]:
    """``f`` paged at T0 and cleared at ``at``, both delivered: the resolve posted."""
    b.apply(f, T0)
    b.delivered(T0)
    b.apply(f.model_copy(update={"cleared": True, "last_seen": at}), at)
    [resolve] = b.due(at)
    b.delivered(at)
    return resolve


def test_an_incident_open_again_within_the_retention_is_never_resolved_by_a_late_resend() -> None:
    b = book()
    resolve = resolved_once(b)
    reopened = finding().model_copy(update={"first_seen": T0 + 100, "last_seen": T0 + 100})
    assert [a.kind for a in b.apply(reopened, T0 + 100)] == ["open"]
    assert b.resolved == {}   # replaced by the open alert of its labels
    for now in range(int(T0) + 100, int(T0 + 10 + RESENT) + 120, 30):
        for alert in b.due(now):
            assert ts(alert["endsAt"]) > now, f"a resolve of the open alert at {now - T0:.0f}s: {alert}"
            assert alert["labels"] == resolve["labels"]
        b.delivered(now)


def test_one_open_again_and_sent_as_its_fallback_is_not_resolved_by_the_fallbacks_resolve() -> None:
    """An incident refused (sent as ``OpsloopPageRejected``) resolves as the fallback; the next one, refused too,
    fires as the same fallback labels: the first one's retained resolve must not end it."""
    b = book()
    b.apply(finding(), T0)
    [out] = b.outgoing(T0)
    b.rejected(out, "label refused", T0)
    b.delivered(T0)
    b.apply(finding().model_copy(update={"cleared": True, "last_seen": T0 + 10}), T0 + 10)
    [resolve] = b.due(T0 + 10)
    fallback = fallback_labels(labels_for(finding()), finding().id)
    assert resolve["labels"] == fallback
    b.delivered(T0 + 10)
    reopened = finding().model_copy(update={"first_seen": T0 + 20, "last_seen": T0 + 20})
    b.apply(reopened, T0 + 20)
    [out] = b.outgoing(T0 + 20)
    b.rejected(out, "label refused", T0 + 20)
    b.delivered(T0 + 20)
    for now in (T0 + 80, T0 + 140, T0 + 500):
        assert all(ts(a["endsAt"]) > now for a in b.due(now)), b.due(now)


def test_a_resolve_replaced_by_its_fallback_is_re_sent_as_the_fallback() -> None:
    b = book()
    b.apply(finding(), T0)
    b.delivered(T0)
    b.apply(finding().model_copy(update={"cleared": True, "last_seen": T0 + 10}), T0 + 10)
    [refused] = b.outgoing(T0 + 10)
    fallback = b.rejected(refused, "refused", T0 + 10)
    assert fallback is not None
    b.delivered(T0 + 10, replaced=[Outgoing(fallback, refused.record)])
    [again] = b.due(T0 + 70)
    assert again["labels"] == fallback["labels"] and again["endsAt"] == fallback["endsAt"]


def test_a_resend_after_the_clock_stepped_back_never_ends_in_the_future() -> None:
    """Restored after a restart (re-sent at once) with the wall clock stepped back 10 min: its endsAt would be
    ahead of Alertmanager's clock, which would fire the alert again until then."""
    b = book()
    resolved_once(b, at=T0 + 10)
    again = book()
    again.restore(orjson.loads(orjson.dumps(b.to_dict())))
    back = T0 + 10 - 600
    [alert] = again.due(back)
    assert ts(alert["endsAt"]) <= back and ts(alert["startsAt"]) <= ts(alert["endsAt"])


def test_the_resolves_re_sent_are_in_the_state_file_and_an_older_file_still_loads() -> None:
    b = book()
    resolve = resolved_once(b)
    doc = orjson.loads(orjson.dumps(b.to_dict()))
    assert len(doc["resolved"]) == 1
    restarted = book()
    restarted.restore(doc)
    [again] = restarted.due(T0 + 11)   # at once after a restart, as the open alerts
    assert (again["labels"], again["endsAt"]) == (resolve["labels"], resolve["endsAt"])
    del doc["resolved"]                # a file from before it
    older = book()
    older.restore(doc)
    assert older.resolved == {} and older.due(T0 + 100) == []
    doc["resolved"] = [{"finding_id": "x", "labels": {"a": "b"}, "annotations": {}, "starts_at": T0,
                        "ends_at": "later"}]
    with pytest.raises(ValueError, match=r"resolved\[0\]\.ends_at"):
        book().restore(doc)


def test_the_resolves_re_sent_are_bounded_and_best_effort_ones_are_sent_once() -> None:
    b = book(max_pending_resolves=5)
    for i in range(8):
        b.apply(finding(hypervisor=f"hv-{i}"), T0)
    b.delivered(T0)
    for i in range(4):
        b.apply(finding(hypervisor=f"hv-{i}", cleared=True, last_seen=T0 + 10), T0 + 10)
    b.apply(finding(hypervisor="never-open-here", cleared=True, last_seen=T0 + 10), T0 + 10)   # best effort
    assert len(b.due(T0 + 10)) == 5
    b.delivered(T0 + 10)
    for i in range(4, 8):
        b.apply(finding(hypervisor=f"hv-{i}", cleared=True, last_seen=T0 + 20), T0 + 20)
    b.delivered(T0 + 20)
    # the newest five (the oldest went, each delivered once), the best-effort one sent once
    assert sorted(a["labels"]["hypervisor"] for a in b.due(T0 + 80)) == [f"hv-{i}" for i in range(3, 8)]
    zero = book(resend_resolved_s=0)
    resolved_once(zero)
    assert zero.due(T0 + 100) == [] and zero.next_due(T0 + 100) == float("inf")
    with pytest.raises(ValueError, match="resend_resolved_s"):
        book(resend_resolved_s=float("inf"))


@pytest.mark.parametrize("value", [-1, 86_401, "soon", float("nan")])
def test_resend_resolved_s_is_a_validated_setting(value: Any) -> None:
    assert PagingConfig().resend_resolved_s == RESENT
    assert paging_config(Settings(controllers={"paging": {"resend_resolved_s": 0}})).resend_resolved_s == 0
    with pytest.raises(PagingConfigError, match="resend_resolved_s"):
        paging_config(Settings(controllers={"paging": {"resend_resolved_s": value}}))


class Refusing:
    """Alertmanager (or a proxy) that takes everything but the re-sent resolves (endsAt in the past)."""

    def __init__(self) -> None:
        self.bodies: list[list[dict[str, Any]]] = []
        self.refuse = False

    def post(self, alerts: list[dict[str, Any]]) -> PostResult:
        self.bodies.append(alerts)
        refused = [a for a in alerts if self.refuse and ts(a["endsAt"]) <= T0 + 100]
        return PostResult(accepted=len(alerts) - len(refused), rejected=[(a, "refused") for a in refused])

    def close(self) -> None:
        pass


def test_a_refused_resend_is_said_and_dropped_never_counted_as_a_lost_page(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    client = Refusing()
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest", resend_interval_s=60)
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=None, client=client)  # type: ignore[arg-type]
    svc.handle_records([finding().encode()], T0)
    svc.deliver(T0)
    svc.handle_records([finding(cleared=True, last_seen=T0 + 10).encode()], T0 + 10)
    assert svc.deliver(T0 + 10) == 1
    client.refuse = True
    dropped, replaced = metrics.DROPPED._value.get(), metrics.REPLACED._value.get()
    with caplog.at_level(logging.WARNING):
        assert svc.deliver(T0 + 70) == 0
    assert [getattr(r, "fields", {}).get("finding_id") for r in caplog.records
            if r.getMessage() == "resolve_resend_rejected"] == [finding().id]
    assert (metrics.DROPPED._value.get(), metrics.REPLACED._value.get()) == (dropped, replaced)
    assert svc.book.resolved == {} and svc.book.due(T0 + 200) == []
