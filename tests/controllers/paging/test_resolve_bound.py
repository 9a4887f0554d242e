"""The paging book's resolve queue is bounded (controllers.paging.max_pending_resolves).

A clear for a finding not open here queues a best-effort resolve; while Alertmanager was down, or while a
new group replayed the topic from its start, 20,000 such clears held 20,000 resolves (about 28 MiB) and
every step rebuilt the whole batch. Over the bound the oldest best-effort resolves go first; a resolve of
an alert we paged goes only when no best-effort one is left. Each drop is counted in
opsloop_paging_resolves_dropped_total{kind} and logged, sampled.
"""

from __future__ import annotations

import logging

import orjson
import pytest
from prometheus_client import REGISTRY

from opsloop.controllers.paging import service as paging_service
from opsloop.controllers.paging.book import PagingBook, PendingResolve
from opsloop.controllers.paging.config import PagingConfig, PagingConfigError, paging_config
from opsloop.controllers.paging.service import PagingService
from opsloop.config import Settings
from opsloop.log import Sampled
from opsloop.records import Finding, Severity

T0 = 1_795_310_400.0


def cleared(i: int, host: str = "h") -> Finding:
    return Finding(detector="anomaly.power", what="x", where={"host": f"{host}{i}"}, severity=Severity.CRITICAL,
                   first_seen=T0, last_seen=T0, cleared=True)


def opened(i: int) -> Finding:
    return Finding(detector="anomaly.power", what="x", where={"host": f"paged{i}"}, severity=Severity.CRITICAL,
                   first_seen=T0, last_seen=T0)


def cleared_copy(f: Finding) -> Finding:
    return Finding(detector=f.detector, what=f.what, where=dict(f.where), severity=f.severity,
                   first_seen=f.first_seen, last_seen=f.last_seen, cleared=True)


def hosts(book: PagingBook) -> list[str]:
    """The hosts of the resolves the next batch carries, in order."""
    assert not book.open
    return [a["labels"]["host"] for a in book.due(T0)]


def bounded_book(cap: int) -> tuple[PagingBook, list[PendingResolve]]:
    dropped: list[PendingResolve] = []
    return PagingBook(max_pending_resolves=cap, on_drop=dropped.append), dropped


def test_the_audit_repro_stays_bounded_at_the_default() -> None:
    b = PagingBook()
    for i in range(20_000):   # clears of ids never open here (Alertmanager down, or a replay)
        b.apply(cleared(i), T0)
    assert sum(len(q) for q in b.resolves.values()) == 10_000   # the default bound
    assert len(b.due(T0)) == b.pending(T0) == 10_000


def test_over_the_bound_the_oldest_best_effort_resolves_are_dropped_and_reported() -> None:
    b, dropped = bounded_book(100)
    for i in range(1000):
        b.apply(cleared(i), T0)
    assert b.pending_resolves() == 100
    assert hosts(b) == [f"h{i}" for i in range(900, 1000)]   # the newest kept
    assert len(dropped) == 900 and all(r.best_effort for r in dropped)
    assert dropped[0].labels["host"] == "h0"


def test_resolves_of_paged_alerts_outlive_any_flood_of_best_effort_ones() -> None:
    b, dropped = bounded_book(10)
    for i in range(5):
        b.apply(opened(i), T0)
    b.delivered(T0)
    for i in range(5):   # the alerts we paged clear while Alertmanager is down
        b.apply(cleared_copy(opened(i)), T0 + 1)
    for i in range(1000):
        b.apply(cleared(i), T0 + 2)
    kept = hosts(b)
    assert [h for h in kept if h.startswith("paged")] == [f"paged{i}" for i in range(5)]
    assert len(kept) == 10 and kept[5:] == [f"h{i}" for i in range(995, 1000)]
    assert len(dropped) == 995 and not [r for r in dropped if not r.best_effort]


def test_alerts_opened_and_cleared_in_a_replay_are_best_effort_too() -> None:
    # Catch-up from the earliest offset: findings open and clear before anything is delivered.
    b, dropped = bounded_book(4)
    b.apply(opened(0), T0)
    b.delivered(T0)          # paged for real
    b.apply(cleared_copy(opened(0)), T0 + 1)
    for i in range(1, 10):
        b.apply(opened(i), T0 + 2)
        b.apply(cleared_copy(opened(i)), T0 + 3)
    assert hosts(b) == ["paged0", "paged7", "paged8", "paged9"]
    assert [r.labels["host"] for r in dropped] == [f"paged{i}" for i in range(1, 7)]
    assert all(r.best_effort for r in dropped)


def page_then_clear(b: PagingBook, n: int) -> None:
    """Open n alerts, deliver them (paged for real), then clear them: n resolves of paged alerts."""
    for i in range(n):
        b.apply(opened(i), T0)
    b.delivered(T0)
    for i in range(n):
        b.apply(cleared_copy(opened(i)), T0 + 1)


def test_with_no_best_effort_resolve_left_the_oldest_paged_one_goes() -> None:
    b, dropped = bounded_book(3)
    page_then_clear(b, 5)
    assert hosts(b) == ["paged2", "paged3", "paged4"]
    assert [r.labels["host"] for r in dropped] == ["paged0", "paged1"] and not any(r.best_effort for r in dropped)


def test_a_delivered_batch_frees_the_whole_bound() -> None:
    b, dropped = bounded_book(3)
    for i in range(3):
        b.apply(cleared(i), T0)
    assert b.delivered(T0)[:2] == ([], 3)
    for i in range(3, 6):
        b.apply(cleared(i), T0)
    assert dropped == [] and hosts(b) == ["h3", "h4", "h5"]


def test_restored_state_is_bounded_and_keeps_which_resolves_are_best_effort() -> None:
    big, _ = bounded_book(50)
    page_then_clear(big, 3)
    for i in range(40):
        big.apply(cleared(i), T0 + 2)
    doc = orjson.loads(orjson.dumps(big.to_dict()))
    small, dropped = bounded_book(10)
    small.restore(doc)
    assert [h for h in hosts(small) if h.startswith("paged")] == ["paged0", "paged1", "paged2"]
    assert small.pending_resolves() == 10 and len(dropped) == 33 and all(r.best_effort for r in dropped)
    # a state file from before the flag: every saved resolve counts as one of an alert we paged
    for r in doc["resolves"]:
        del r["best_effort"]
    old, _ = bounded_book(100)
    old.restore(doc)
    assert old.pending_resolves() == 43 and not any(r.best_effort for q in old.resolves.values() for r in q)
    doc["resolves"][0]["best_effort"] = "yes"
    with pytest.raises(ValueError, match="best_effort"):
        old.restore(doc)


def test_the_bound_is_a_validated_setting() -> None:
    assert PagingConfig().max_pending_resolves == 10_000
    assert paging_config(Settings(controllers={"paging": {"max_pending_resolves": 500}})).max_pending_resolves == 500
    for bad in (0, -1, 10_000_000):
        with pytest.raises(PagingConfigError, match="max_pending_resolves"):
            paging_config(Settings(controllers={"paging": {"max_pending_resolves": bad}}))
    with pytest.raises(ValueError, match="max_pending_resolves"):
        PagingBook(max_pending_resolves=0)


class DownClient:
    def post(self, alerts: list[dict]) -> None:   # never reached: nothing is delivered in this test
        raise AssertionError("unexpected delivery")

    def close(self) -> None:
        pass


def dropped_total(kind: str) -> float:
    return REGISTRY.get_sample_value("opsloop_paging_resolves_dropped_total", {"kind": kind}) or 0.0


def test_the_service_counts_every_drop_and_logs_them_sampled(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(paging_service, "DROP_LOG", Sampled(60.0, clock=lambda: 0.0))   # time stands still
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest", max_pending_resolves=20)
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=None, client=DownClient())  # type: ignore[arg-type]
    before_best, before_paged = dropped_total("best_effort"), dropped_total("paged")
    with caplog.at_level(logging.WARNING, logger="opsloop.paging"):
        svc.handle_records([cleared(i, "svc").encode() for i in range(70)], T0)
    assert svc.book.pending_resolves() == 20
    assert dropped_total("best_effort") - before_best == 50
    assert dropped_total("paged") == before_paged
    lines = [r for r in caplog.records if r.getMessage() == "resolve_dropped"]
    assert len(lines) == 1   # 50 drops, one line
    svc.save_state()
    assert len(orjson.loads((tmp_path / "state.json").read_bytes())["resolves"]) == 20
