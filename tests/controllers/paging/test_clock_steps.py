"""Records of one finding id whose stamps do not follow their order: a producer's wall clock stepped back
(NTP) between two incidents, or a clear said again with a new ``last_seen`` (an actuator restarted with
the clear still owed). ``last_seen`` then no longer orders the incidents; before, a replay after a crash
(or the re-sent clear) of an older incident resolved the newer incident's page, whose own record paged it
again, or re-opened a resolved incident. An incident never comes back after its clear: its records are
ignored whatever their stamps. A clear of the open incident still applies whatever its ``last_seen``.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from opsloop.controllers.paging import service as paging_service
from opsloop.controllers.paging.book import MAX_CLEARED_PER_ID, PagingBook
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from opsloop.records import Finding, Severity
from tests.controllers.paging.test_schedule_regressions import Alertmanager, Consumer

T0 = 1_795_310_400.0
AHEAD = 100.0   # the producer's clock ran this far ahead until NTP stepped it back


def rec(first_seen: float, last_seen: float, cleared: bool = False) -> Finding:
    return Finding(detector="edge.fail_static", what="edge weights held (fail static)",
                   where={"listener": "web", "edge": "ams1"}, severity=Severity.CRITICAL,
                   first_seen=first_seen, last_seen=last_seen, cleared=cleared)


def kinds(book: PagingBook, f: Finding, now: float) -> list[str]:
    return [a.kind for a in book.apply(f, now)]


# incident A: opened, refreshed with the clock ahead; the clock steps back; A cleared, then B opens
A_OPEN, A_AHEAD, A_CLEAR = rec(T0, T0), rec(T0, T0 + AHEAD), rec(T0, T0 + 10, cleared=True)
B_OPEN, B_CLEAR = rec(T0 + 20, T0 + 20), rec(T0 + 20, T0 + 30, cleared=True)


def _live(history: list[Finding], now: float) -> tuple[PagingBook, list[list[str]]]:
    b = PagingBook()
    said = []
    for f in history:
        said.append(kinds(b, f, now))
        b.delivered(now)
    return b, said


def test_a_replay_after_a_clock_step_neither_resolves_nor_repages_the_newer_incident() -> None:
    history = [A_OPEN, A_AHEAD, A_CLEAR, B_OPEN]
    b, said = _live(history, T0 + 40)
    assert said == [["open"], ["refresh"], ["resolve"], ["open"]]   # the step back itself is handled
    for f in history:   # redelivered from the committed offset onto the saved state
        assert kinds(b, f, T0 + 50) in (["ignore"], ["refresh"]), f
    assert b.pending_resolves() == 0
    [alert] = b.open.values()
    assert alert.first_seen == B_OPEN.first_seen and alert.delivered_once


def test_a_replay_after_a_clock_step_does_not_reopen_a_resolved_incident() -> None:
    history = [A_OPEN, A_AHEAD, A_CLEAR, B_OPEN, B_CLEAR]
    b, said = _live(history, T0 + 40)
    assert said[-1] == ["resolve"] and b.open == {}
    for f in history:
        assert kinds(b, f, T0 + 50) == ["ignore"], f
    assert b.open == {} and b.pending_resolves() == 0


def test_a_clear_said_again_with_a_new_last_seen_leaves_the_newer_incident_paged() -> None:
    """The actuator restarts owing the clear of A (delivered, but not known to be): it says it again, stamped
    now, then the open B again. Whatever the clock, A's clear is not B's."""
    b, _ = _live([A_OPEN, rec(T0, T0 + 10, cleared=True), B_OPEN], T0 + 40)
    assert kinds(b, rec(T0, T0 + 30, cleared=True), T0 + 30) == ["ignore"]
    assert kinds(b, rec(B_OPEN.first_seen, T0 + 31), T0 + 31) == ["refresh"]
    assert [a.first_seen for a in b.open.values()] == [B_OPEN.first_seen] and b.pending_resolves() == 0


def test_a_clear_of_the_open_incident_still_applies_after_a_clock_step() -> None:
    b, _ = _live([A_OPEN, A_AHEAD], T0 + 40)
    assert kinds(b, A_CLEAR, T0 + 40) == ["resolve"]   # last_seen before the record applied: a page never sticks
    assert kinds(b, B_OPEN, T0 + 40) == ["open"]       # the next incident pages


def test_the_cleared_incidents_survive_a_restart_bounded_and_an_older_state_file_loads() -> None:
    b, _ = _live([A_OPEN, A_AHEAD, A_CLEAR, B_OPEN], T0 + 40)
    doc = orjson.loads(orjson.dumps(b.to_dict()))
    restored = PagingBook()
    restored.restore(doc)
    assert kinds(restored, A_AHEAD, T0 + 50) == ["ignore"]
    old = {k: v for k, v in doc.items() if k != "cleared"}   # a state file from before the marks
    restored.restore(old)
    assert [a.first_seen for a in restored.open.values()] == [B_OPEN.first_seen]
    with pytest.raises(ValueError, match=r"cleared\[0\]"):
        restored.restore({**doc, "cleared": [[A_OPEN.id, "yesterday"]]})
    c = PagingBook()
    for i in range(MAX_CLEARED_PER_ID + 3):   # incidents one after another: only the last few are kept
        c.apply(rec(T0 + 10 * i, T0 + 10 * i), T0 + 100)
        c.apply(rec(T0 + 10 * i, T0 + 10 * i + 5, cleared=True), T0 + 100)
    assert len(c.cleared[A_OPEN.id]) == MAX_CLEARED_PER_ID


def test_a_crash_before_the_commit_replayed_across_a_clock_step_pages_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the service: a crash after the state was saved and before the commit replays the batch; in
    other batch boundaries the replay resolved B's page and paged it again."""
    now = [T0 + 40]
    monkeypatch.setattr(paging_service, "time", SimpleNamespace(time=lambda: now[0]))
    am = Alertmanager()
    am.now = now[0]
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest")

    def service(batches: list[list[Finding]]) -> PagingService:
        svc = PagingService(cfg, "127.0.0.1:1", consumer=Consumer(batches), producer=None,  # type: ignore[arg-type]
                            client=am)  # type: ignore[arg-type]
        svc.load_state()
        return svc

    for batch in ([A_OPEN], [A_AHEAD], [A_CLEAR], [B_OPEN]):
        service([batch]).step()
    assert am.firing == {"critical"} and am.pages == 2               # A, then B
    now[0] += 10
    am.now = now[0]
    replay = service([[A_AHEAD], [A_CLEAR], [B_OPEN]])               # the uncommitted records, polled apart
    for _ in range(3):
        replay.step()
        assert am.firing == {"critical"}, "the newer incident's page was resolved"
    assert am.pages == 2, "the newer incident was paged again"


# -- our own clock stepped back: the re-sends go on ---------------------------------------------------------------
BACK = 3600.0   # the paging host's wall clock stepped back an hour (NTP after a clock that ran ahead)


def test_re_sends_go_on_after_our_clock_stepped_back() -> None:
    """Scheduled as ``last_sent + resend_interval_s`` on the wall clock, the re-sends waited for the hour lost: no
    re-send went out and every open alert expired in Alertmanager at its endsAt (on-call told it resolved)."""
    b = PagingBook(resend_interval_s=60.0, alert_ttl_s=240.0)
    b.apply(A_OPEN, T0)
    assert len(b.due(T0)) == 1
    b.delivered(T0)
    back = T0 + 30 - BACK
    assert b.next_due(back) == 0.0 and b.pending(back) == 1
    [again] = b.due(back)
    assert again["labels"] == b.open[A_OPEN.id].labels
    b.delivered(back)
    assert b.due(back + 30) == [] and b.next_due(back + 30) == 30.0   # then on the interval, from the new time
    assert len(b.due(back + 60)) == 1


def test_a_delivered_resolve_is_re_sent_after_our_clock_stepped_back() -> None:
    b = PagingBook(resend_interval_s=60.0, alert_ttl_s=240.0)
    b.apply(A_OPEN, T0)
    b.delivered(T0)
    b.apply(A_CLEAR, T0 + 10)
    b.delivered(T0 + 10)   # the resolve went out: re-sent for resend_resolved_s
    back = T0 + 20 - BACK
    assert b.next_due(back) == 0.0
    [resolve] = b.due(back)
    assert ts(resolve["endsAt"]) <= back   # never ending ahead of now (an endsAt ahead would re-open it)


def test_the_service_re_sends_in_the_step_after_our_clock_stepped_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [T0]
    monkeypatch.setattr(paging_service, "time", SimpleNamespace(time=lambda: now[0]))
    am = Alertmanager()
    posts: list[list[dict[str, object]]] = []
    post = am.post
    am.post = lambda alerts: (posts.append(alerts), post(alerts))[1]   # type: ignore[method-assign]
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest", resend_interval_s=60)
    svc = PagingService(cfg, "127.0.0.1:1", consumer=Consumer([[A_OPEN]]), producer=None,  # type: ignore[arg-type]
                        client=am)  # type: ignore[arg-type]
    am.now = now[0]
    svc.step()
    assert len(posts) == 1
    now[0] = am.now = T0 + 30 - BACK
    svc.step()
    assert len(posts) == 2 and am.firing == {"critical"}, "no re-send after the clock stepped back"


def ts(stamp: object) -> float:
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
