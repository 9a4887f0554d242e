"""The on-disk spool: order, partial failure, bound, and survival across a restart."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.collect.spool import Record, Spool


def recs(*vals: int) -> list[Record]:
    return [Record("telemetry.lb", f"k{v % 3}", f'{{"v":{v}}}'.encode()) for v in vals]


def drain_all(sp: Spool) -> list[Record]:
    out = []
    while (item := sp.oldest()) is not None:
        path, rs = item
        out.extend(rs)
        sp.complete(path, [])
    return out


def test_replays_in_order(tmp_path: Path) -> None:
    sp = Spool(tmp_path, 1 << 20)
    sp.append(recs(1, 2))
    sp.append(recs(3))
    assert drain_all(sp) == recs(1, 2, 3)
    assert sp.empty()


def test_partial_failure_keeps_only_failed_records_first(tmp_path: Path) -> None:
    sp = Spool(tmp_path, 1 << 20)
    sp.append(recs(1, 2, 3))
    sp.append(recs(4))
    path, rs = sp.oldest()  # type: ignore[misc]
    sp.complete(path, [rs[1], rs[2]])
    assert drain_all(sp) == recs(2, 3, 4)


def test_survives_restart(tmp_path: Path) -> None:
    Spool(tmp_path, 1 << 20).append(recs(1, 2))
    sp = Spool(tmp_path, 1 << 20)
    sp.append(recs(3))
    assert drain_all(sp) == recs(1, 2, 3)


def test_bound_drops_oldest_and_counts(tmp_path: Path) -> None:
    one = len(recs(1)[0].to_line())
    sp = Spool(tmp_path, max_bytes=one * 3)
    for v in range(6):
        sp.append(recs(v))
    assert sp.size_bytes() <= one * 3
    assert sp.dropped_records == 3
    assert drain_all(sp) == recs(3, 4, 5)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=5), min_size=1, max_size=8),
       st.data())
def test_property_nothing_lost_order_kept(tmp_path_factory, rounds: list[list[int]], data: st.DataObject) -> None:
    sp = Spool(tmp_path_factory.mktemp("spool"), 1 << 24)
    for r in rounds:
        sp.append(recs(*r))
    delivered: list[Record] = []
    attempts = 0
    while (item := sp.oldest()) is not None:
        path, rs = item
        attempts += 1
        # A failed send fails a suffix of the segment (per-partition order in the producer);
        # the broker comes back after a few attempts.
        cut = data.draw(st.integers(0, len(rs))) if attempts < 20 else len(rs)
        delivered.extend(rs[:cut])
        sp.complete(path, rs[cut:])
    assert delivered == [x for r in rounds for x in recs(*r)]
