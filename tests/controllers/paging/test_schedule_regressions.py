"""What the seeded schedules (test_schedule_book.py) found, one test each; every one failed before its fix.

1. The book applied every record whatever its age: a replay after a crash between saving the state and
   committing the offsets (or a stale copy of a record) brought back an older incident's clear, which
   resolved the newer incident, whose own replayed record then paged it again; a firing record replayed
   after its clear reopened the page; an old severity flipped it back (a second page).
2. The service posted to Alertmanager before saving the state: a crash after the post replayed the batch onto
   a book older than what Alertmanager had seen, in other batch boundaries (a resolved page paged again).
3. A finding stamped in the future was applied: a clear stamped a day ahead resolved a real page, a firing
   one paged; now refused, counted and dead-lettered like a record that is no finding.
"""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from opsloop.controllers.paging import metrics
from opsloop.controllers.paging import service as paging_service
from opsloop.controllers.paging.alertmanager import PostResult
from opsloop.controllers.paging.book import PagingBook
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from opsloop.records import Finding, Severity
from tests.helpers import ConsumerMsg

T0 = 1_795_310_400.0


def rec(first_seen: float, last_seen: float, cleared: bool = False,
        severity: Severity = Severity.CRITICAL) -> Finding:
    return Finding(detector="anomaly.power", what="power off its model", where={"host": "h1"}, severity=severity,
                   first_seen=first_seen, last_seen=last_seen, cleared=cleared)


def kinds(book: PagingBook, f: Finding, now: float) -> list[str]:
    return [a.kind for a in book.apply(f, now)]


# -- 1. stale records ---------------------------------------------------------------------------------
def test_a_replayed_clear_of_an_older_incident_neither_resolves_nor_repages_the_newer_one() -> None:
    b = PagingBook()
    history = [rec(T0, T0), rec(T0, T0 + 60, cleared=True), rec(T0 + 120, T0 + 120)]   # incident A, then B
    for f in history:
        b.apply(f, T0 + 130)
        b.delivered(T0 + 130)
    for f in history:   # redelivered from the committed offset onto the saved state
        assert kinds(b, f, T0 + 140) in (["ignore"], ["refresh"])
    assert b.pending_resolves() == 0 and list(b.open.values())[0].delivered_once


def test_a_firing_record_replayed_after_its_clear_does_not_reopen_the_page() -> None:
    b = PagingBook()
    b.apply(rec(T0, T0), T0)
    b.apply(rec(T0, T0 + 60, cleared=True), T0 + 60)
    b.delivered(T0 + 60)
    assert kinds(b, rec(T0, T0 + 30), T0 + 70) == ["ignore"]
    assert kinds(b, rec(T0, T0 + 60, cleared=True), T0 + 70) == ["ignore"]   # a duplicate clear: one resolve
    assert b.open == {} and b.due(T0 + 70) == []
    assert kinds(b, rec(T0 + 100, T0 + 100), T0 + 100) == ["open"]              # the next incident pages


def test_an_older_severity_does_not_flip_the_page_back() -> None:
    b = PagingBook()
    b.apply(rec(T0, T0, severity=Severity.WARNING), T0)
    assert kinds(b, rec(T0, T0 + 10), T0 + 10) == ["severity_changed"]
    assert kinds(b, rec(T0, T0, severity=Severity.WARNING), T0 + 20) == ["ignore"]
    assert list(b.open.values())[0].labels["severity"] == "critical"


def test_a_clear_of_the_open_incident_applies_whatever_its_last_seen() -> None:
    b = PagingBook()
    b.apply(rec(T0, T0 + 100), T0 + 100)
    assert kinds(b, rec(T0, T0 + 50, cleared=True), T0 + 110) == ["resolve"]   # never a stuck page


def test_the_marks_survive_a_restart_and_a_state_file_from_before_them_loads() -> None:
    b = PagingBook()
    b.apply(rec(T0, T0), T0)
    b.apply(rec(T0, T0 + 60, cleared=True), T0 + 60)
    doc = orjson.loads(orjson.dumps(b.to_dict()))
    restored = PagingBook()
    restored.restore(doc)
    assert kinds(restored, rec(T0, T0 + 30), T0 + 70) == ["ignore"]
    old = {"version": 1, "open": [{"finding_id": rec(T0, T0).id, "labels": {"alertname": "A"},
                                   "annotations": {"summary": "s"}, "starts_at": T0, "event_time": T0 + 5}],
           "resolves": []}
    restored.restore(old)
    assert kinds(restored, rec(T0, T0 + 1), T0 + 70) == ["ignore"]   # older than the record it opened on
    with pytest.raises(ValueError, match=r"closed\[0\]"):
        restored.restore({**doc, "closed": [["id", "yesterday", T0, True]]})


# -- 2. save before posting ---------------------------------------------------------------------------
class Consumer:
    def __init__(self, batches: list[list[Finding]]) -> None:
        self.batches = batches

    def poll(self, timeout_ms: int = 0) -> dict[int, list[ConsumerMsg]]:
        batch = self.batches.pop(0) if self.batches else []
        return {0: [ConsumerMsg("findings", 0, i, None, f.encode()) for i, f in enumerate(batch)]} if batch else {}

    def commit(self, timeout_ms: int | None = None) -> None:
        pass


class Died(BaseException):
    pass


class Alertmanager:
    """Fires what it is posted (a page when a label set starts firing); ``die``: the process ends right
    after Alertmanager took a body."""

    def __init__(self) -> None:
        self.firing: set[str] = set()
        self.pages = 0
        self.die = False
        self.now = T0

    def post(self, alerts: list[dict[str, Any]]) -> PostResult:
        before = set(self.firing)
        for a in alerts:
            ends = datetime.fromisoformat(a["endsAt"].replace("Z", "+00:00")).timestamp()
            (self.firing.add if ends > self.now else self.firing.discard)(a["labels"]["severity"])
        self.pages += len(self.firing - before)
        if self.die:
            raise Died()
        return PostResult(accepted=len(alerts))

    def close(self) -> None:
        pass


def test_a_crash_after_the_post_replays_onto_the_state_alertmanager_saw(tmp_path, monkeypatch) -> None:
    now = [T0 + 100]
    monkeypatch.setattr(paging_service, "time", SimpleNamespace(time=lambda: now[0]))   # step's clock only
    am = Alertmanager()
    am.now = now[0]
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest")
    opened, cleared = rec(T0, T0), rec(T0, T0 + 60, cleared=True)

    def service(batches: list[list[Finding]]) -> PagingService:
        svc = PagingService(cfg, "127.0.0.1:1", consumer=Consumer(batches), producer=None,  # type: ignore[arg-type]
                            client=am)  # type: ignore[arg-type]
        svc.load_state()
        return svc

    service([[opened]]).step()                       # paged, saved, committed
    assert am.firing == {"critical"} and am.pages == 1
    am.die = True
    with pytest.raises(Died):
        service([[cleared]]).step()                  # the resolve is posted, then the process dies
    am.die = False
    assert am.firing == set()
    now[0] += 10
    am.now = now[0]
    service([[opened], [cleared]]).step()            # the replay, in another batch: the stale open first
    assert am.pages == 1, "the resolved page was paged again"


# -- 3. the future --------------------------------------------------------------------------------------
class Sent:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None]] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None) -> None:
        self.records.append((topic, value))

    def flush(self, timeout: float | None = None) -> None:
        pass


def test_a_finding_stamped_in_the_future_is_refused_and_dead_lettered(tmp_path) -> None:
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest")
    producer = Sent()
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=producer,  # type: ignore[arg-type]
                        client=Alertmanager())  # type: ignore[arg-type]
    svc.handle_records([rec(T0, T0).encode()], T0)
    rejected = metrics.REJECTED._value.get()
    # an older incident's clear (the open incident's own is taken, clamped: test_unsaved_marks.py), a new one
    ahead = [rec(T0 - 60, T0 + 86_400, cleared=True), rec(T0 + 86_400, T0 + 86_400)]
    actions = svc.handle_records([f.encode() for f in ahead] + [rec(T0, T0 + 10).encode()], T0 + 10,
                                 [(0, 7, None), (0, 8, None), (0, 9, None)])
    assert [a.kind for a in actions] == ["refresh"]          # the good record behind them is applied
    assert metrics.REJECTED._value.get() - rejected == 2
    dls = [orjson.loads(v) for t, v in producer.records if t == "telemetry.deadletter"]
    assert [d["offset"] for d in dls] == [7, 8] and all("in the future" in d["reason"] for d in dls)
    assert len(svc.book.open) == 1                           # the page is still open
    assert kinds(svc.book, rec(T0, T0 + 300), T0) == ["refresh"]   # within the skew: applied


def test_two_records_of_one_instant_keep_the_higher_severity_whatever_their_order() -> None:
    """A warning and a critical record of one incident with the same last_seen: a replay of both flipped
    the page to warning (a resolve) and back to critical (a second page)."""
    b = PagingBook()
    for f in (rec(T0, T0 + 60, severity=Severity.WARNING), rec(T0, T0 + 60)):
        b.apply(f, T0 + 70)
    b.delivered(T0 + 70)
    assert b.open[rec(T0, T0).id].labels["severity"] == "critical"
    replay = [kinds(b, f, T0 + 80) for f in (rec(T0, T0 + 60, severity=Severity.WARNING), rec(T0, T0 + 60))]
    assert replay == [["ignore"], ["refresh"]]
    assert b.open[rec(T0, T0).id].labels["severity"] == "critical"
    c = PagingBook()                                   # the other order: the same page
    for f in (rec(T0, T0 + 60), rec(T0, T0 + 60, severity=Severity.WARNING)):
        c.apply(f, T0 + 70)
    assert c.open[rec(T0, T0).id].labels["severity"] == "critical"
    assert kinds(c, rec(T0, T0 + 61, severity=Severity.WARNING), T0 + 80) == ["severity_changed"]   # later: applies
