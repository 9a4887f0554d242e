"""The on-disk spool: order, partial failure, bound, and survival across a restart."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.collect.spool import Record, Spool
from tests.helpers import wait_until


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


# ------------------------------------------------------------------------------ torn and damaged segments
def test_a_write_torn_by_a_crash_leaves_no_torn_segment(tmp_path: Path, monkeypatch) -> None:
    """The collector is killed half-way through writing a segment: the spool it restarts with is whole."""
    from opsloop import atomic_file
    from opsloop.atomic_file import temporary_path

    sp = Spool(tmp_path, 1 << 20)
    sp.append(recs(1, 2))
    real_open = open
    torn: dict[Path, bytes] = {}

    class Killed(BaseException):
        pass

    def tearing_open(fd, mode="r", *a, **kw):  # type: ignore[no-untyped-def]
        f = real_open(fd, mode, *a, **kw)
        if "w" in mode:
            real_write = f.write

            def write(data: bytes) -> int:
                real_write(data[: len(data) // 2])   # half the bytes reach the disk, then the process dies
                f.flush()
                torn[Path(os.readlink(f"/proc/self/fd/{f.fileno()}"))] = data[: len(data) // 2]
                raise Killed()
            f.write = write  # type: ignore[method-assign]
        return f

    monkeypatch.setattr(atomic_file, "open", tearing_open, raising=False)
    try:
        sp.append(recs(3, 4, 5))
    except Killed:
        pass
    monkeypatch.undo()
    # a SIGKILL runs no cleanup: the half-written temporary file stays as it was (an exception removes it)
    (path, half), = torn.items()
    assert path.name.endswith(".tmp") and path == temporary_path(path.with_suffix(""))
    path.write_bytes(half)
    restarted = Spool(tmp_path, 1 << 20)
    assert drain_all(restarted) == recs(1, 2)
    assert restarted.quarantined_lines == 0 and not list(tmp_path.glob("*.tmp"))


def test_a_torn_segment_is_quarantined_line_by_line_and_the_rest_replayed(tmp_path: Path) -> None:
    sp = Spool(tmp_path, 1 << 20)
    sp.append(recs(1, 2, 3))
    sp.append(recs(4))
    first = sorted(tmp_path.glob("*.jsonl"))[0]
    data = first.read_bytes()
    lines = data.splitlines(keepends=True)
    # a segment written straight to its final name by an older version, torn in its last line,
    # plus a line of garbage in the middle
    first.write_bytes(lines[0] + b"\x00\xffgarbage\n" + lines[1] + lines[2][: len(lines[2]) // 2])
    again = Spool(tmp_path, 1 << 20)
    assert drain_all(again) == recs(1, 2, 4)
    assert again.quarantined_lines == 2 and again.empty() and again.size_bytes() == 0
    bad = (tmp_path / "quarantine" / f"{first.name}.bad").read_bytes()
    assert b"garbage" in bad and bad.count(b"\n") == 2


def test_a_segment_with_nothing_decodable_and_stray_files_do_not_stop_the_drain(tmp_path: Path) -> None:
    (tmp_path / "000000000000.jsonl").write_bytes(b"{not json\n[1,2]\n")
    (tmp_path / "notes.jsonl").write_bytes(b"hello\n")
    sp = Spool(tmp_path, 1 << 20)
    sp.append(recs(7))
    assert drain_all(sp) == recs(7)
    assert sp.quarantined_lines == 3
    assert (tmp_path / "quarantine" / "notes.jsonl.bad").exists()


def test_publish_never_raises_into_the_collection_loop(tmp_path: Path) -> None:
    """A torn spool and a broker that is not there: publish spools, counts, returns."""
    import socket

    from prometheus_client import REGISTRY

    from opsloop.collect.publisher import Publisher

    (tmp_path / "000000000000.jsonl").write_bytes(b'{"t":"telemetry.lb","k":"a","v":"{}"}\n{"t":')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]    # closed again: nothing listens there
    pub = Publisher(f"127.0.0.1:{port}", tmp_path, collector="torn-test", send_timeout_s=1.0)
    try:
        pub.publish(recs(1))
        pub.publish(recs(2))
        # the sender replays the old spool from the start: the torn line is quarantined on the way
        wait_until(lambda: REGISTRY.get_sample_value("opsloop_spool_quarantined_lines_total",
                                                     {"collector": "torn-test"}) == 1.0,
                   timeout=30, interval=0.05, what="the torn line counted")
        got = [r for _, rs in [pub.spool.oldest() or (None, [])] for r in rs]
        assert got[0].key == "a"
        assert pub.spool.count_records() == 3
    finally:
        assert pub.close(timeout_s=0) is False


def test_dropped_records_are_a_counter_that_only_adds_new_drops(tmp_path: Path) -> None:
    """A full spool's drops are exported as opsloop_spool_dropped_records_total: present at 0 from the
    start, then raised by each update by the drops since the previous one (never set, never re-added)."""
    import socket

    from prometheus_client import REGISTRY

    from opsloop.collect.publisher import Publisher

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]    # closed again: nothing listens there, every record is spooled
    one = len(recs(1)[0].to_line())
    pub = Publisher(f"127.0.0.1:{port}", tmp_path, collector="drop-test", spool_max_bytes=one * 2,
                    send_timeout_s=1.0)
    dropped = lambda: REGISTRY.get_sample_value("opsloop_spool_dropped_records_total",  # noqa: E731
                                                {"collector": "drop-test"})
    assert dropped() == 0.0
    assert {f.type for f in REGISTRY.collect()
            if any(x.name == "opsloop_spool_dropped_records_total" for x in f.samples)} == {"counter"}
    try:
        for v in range(5):
            pub._retry_at = float("inf")   # in back-off: publish goes straight to the spool
            pub.publish(recs(v))
        assert pub.spool.dropped_records == 3
        assert dropped() == 3.0
        pub._update_gauges()               # no new drop: the counter stays
        assert dropped() == 3.0
        pub._retry_at = float("inf")
        pub.publish(recs(9))
        assert dropped() == 4.0
    finally:
        pub.close(timeout_s=0)


def test_a_reserved_sequence_number_is_replayed_ahead_of_later_segments(tmp_path: Path) -> None:
    """A round sent from memory that fails is spooled under the number it got when handed over."""
    sp = Spool(tmp_path, max_bytes=1 << 20)
    in_flight = sp.reserve()
    sp.append(recs(2))
    sp.append(recs(3))
    assert sp.first_seq() == in_flight + 1
    sp.append(recs(1), seq=in_flight)
    assert sp.first_seq() == in_flight
    assert drain_all(sp) == recs(1, 2, 3)


def test_a_segment_the_bound_drops_while_it_is_sent_completes_quietly(tmp_path: Path) -> None:
    one = len(recs(1)[0].to_line())
    sp = Spool(tmp_path, max_bytes=one * 2)
    sp.append(recs(1))
    path, _ = sp.oldest() or (None, [])
    sp.append(recs(2))
    sp.append(recs(3))                     # over the bound: segment 1 (being sent) is dropped
    assert path is not None and not path.exists() and sp.dropped_records == 1
    sp.complete(path, recs(1))             # its send failed: already gone, counted as dropped
    assert drain_all(sp) == recs(2, 3) and sp.count_records() == 0
