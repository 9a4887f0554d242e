"""LogTail across logrotate's ``copytruncate``, torn and huge lines, odd bytes and odd files at the path.

With copytruncate, the lines written between our last read and the copy are only in the copy
(``access.log.1``): before, they were lost at every rotation, and a file truncated and grown past our
offset between two reads was not even seen as truncated (read from the middle of a line on). The copy
is now found by fingerprint (its first bytes and the bytes we last read, at our offset), as Filebeat
and Telegraf's tail do, and its rest read before the truncated file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.collectors.keystone import Config, build
from opsloop.collectors.keystone.tail import MAX_LINE_BYTES, LogTail
from tests.trickle import ends_within

REQ = "uwsgi_req ts_ms={ts} method=GET uri=/v3/auth/tokens status=200 msecs=5 rsize=10 pid=1 addr=127.0.0.1\n"


def append(path: Path, data: str | bytes) -> None:
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def copytruncate(path: Path, rotated: str = ".1") -> Path:
    """What logrotate's copytruncate does: copy the file, then truncate it in place (same inode)."""
    copy = path.with_name(path.name + rotated)
    shutil.copyfile(path, copy)
    with open(path, "r+b") as f:
        f.truncate(0)
    return copy


def test_lines_written_before_the_copy_are_read_from_the_copy(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text("")
    tail = LogTail(log)
    append(log, "a1\n")
    assert tail.read_lines().lines == ["a1"]
    append(log, "a2\na3\n")          # after our read, before the rotation: only in the copy
    copytruncate(log)
    append(log, "b1\n")
    r = tail.read_lines()
    assert r.lines == ["a2", "a3", "b1"], "before: ['b1'], a2 and a3 lost"
    assert (r.truncated, r.unrecovered, r.rotated) == (1, 0, 0)
    append(log, "b2\n")
    assert tail.read_lines().lines == ["b2"]


def test_truncated_and_grown_past_our_offset_is_still_a_truncation(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text("")
    tail = LogTail(log)
    append(log, "a1\n")
    assert tail.read_lines().lines == ["a1"]
    append(log, "a2\n")
    copytruncate(log, "-20261202")    # dateext naming
    new = [f"b{i:03d}" for i in range(50)]  # longer than our offset before the next read
    append(log, "".join(n + "\n" for n in new))
    r = tail.read_lines()
    assert r.lines == ["a2", *new], "before: read on from the old offset, mid-line, b000.. lost"
    assert r.truncated == 1 and r.unrecovered == 0


def test_a_line_torn_at_the_copy_is_joined_and_its_tail_in_the_copy_kept(tmp_path: Path) -> None:
    """A line we read part of is completed from the copy. The copy's unterminated last line is taken as it is
    (a writer writes a line in one write(): the rest went into the file before the truncation, lost with it)."""
    log = tmp_path / "access.log"
    log.write_text("")
    tail = LogTail(log)
    append(log, "a1\nx-par")
    assert tail.read_lines().lines == ["a1"]
    append(log, "tial\na2-unterminated")
    copytruncate(log)
    append(log, "b1\n")
    assert tail.read_lines().lines == ["x-partial", "a2-unterminated", "b1"]


def test_no_copy_or_a_stale_one_is_counted_unrecovered_and_the_new_file_read(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    (tmp_path / "access.log.1").write_text("an older rotation\nwith other lines\n")
    (tmp_path / "access.log.2.gz").write_bytes(b"\x1f\x8b not read")
    log.write_text("")
    tail = LogTail(log)
    append(log, "a1\n")
    assert tail.read_lines().lines == ["a1"]
    append(log, "a2\n")
    with open(log, "r+b") as f:       # copied elsewhere (compressed at once): nothing matches
        f.truncate(0)
    append(log, "b1\n")
    r = tail.read_lines()
    assert r.lines == ["b1"] and r.truncated == 1 and r.unrecovered == 1


def test_the_copy_is_read_within_the_budget_over_several_rounds(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text("")
    tail = LogTail(log, max_bytes=1024)
    append(log, "first\n")
    assert tail.read_lines().lines == ["first"]
    old = [f"old {i:05d}" for i in range(1000)]
    append(log, "".join(n + "\n" for n in old))
    copytruncate(log)
    new = [f"new {i:05d}" for i in range(300)]
    append(log, "".join(n + "\n" for n in new))
    got: list[str] = []
    while True:
        r = tail.read_lines()
        got += r.lines
        if not r.backlog:
            break
    got += tail.read_lines().lines
    assert got == old + new


line_text = st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(line_text, min_size=1, max_size=30), cuts=st.lists(st.integers(0, 10_000), max_size=6),
       rotate_at=st.lists(st.integers(0, 6), max_size=3))
def test_any_write_pattern_with_copytruncate_yields_exactly_the_lines_written(tmp_path_factory, lines, cuts,
                                                                               rotate_at):
    d = tmp_path_factory.mktemp("fuzz")
    log = d / "f.log"
    log.write_text("")
    tail = LogTail(log)
    data = "".join("<" + line + ">\n" for line in lines)   # no two files start alike (as timestamped lines)
    points = sorted({min(c, len(data)) for c in cuts} | {len(data)})
    got: list[str] = []
    start = seen = 0
    for i, p in enumerate(points):
        append(log, data[start:p])
        start = p
        # Writers write a line in one write(), so the copy ends on a line (one torn at the copy lost its rest
        # with the truncation: see the test above); lines we read part of before are completed from the copy.
        # Not a file we have read nothing of: nothing tells it was truncated (empty before and after).
        if i in rotate_at and seen and data[start - 1] == "\n":
            copytruncate(log, f".{i}")
        got += tail.read_lines().lines
        seen = log.stat().st_size
    got += tail.read_lines().lines
    assert got == ["<" + line + ">" for line in lines]


def test_a_huge_line_torn_mid_write_is_one_cut_line(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text("")
    tail = LogTail(log)
    append(log, b"x" * 100_000)                      # a 1 MB line, its first 100 kB written so far
    r = tail.read_lines()
    assert r.overlong == 1 and [len(line) for line in r.lines] == [MAX_LINE_BYTES]
    append(log, b"y" * 900_000 + b"\nshort\n")
    r = tail.read_lines()
    assert r.lines == ["short"] and r.overlong == 0, "before: its rest came out as a line of its own"


def test_odd_bytes_and_huge_lines_are_counted_by_the_collector_not_fatal(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_bytes(REQ.format(ts=1795315485635).encode().replace(b"tokens", b"tok\xffens")   # not UTF-8
                    + b"\xfe\xff\x00garbage\n" + b"z" * 1_000_000 + b"\n"
                    + REQ.format(ts=1795315485636).encode() + b"uwsgi_req ts_ms=17953154")  # torn mid-write
    collector = build(Config(probes={"enabled": False}, uwsgi_access_log=str(log), start_at="start"))
    r = collector.collect()
    [f] = [m.fields for m in r.metrics if m.name == "keystone_logfile"]
    assert (f["lines"], f["parsed"], f["unparsed"], f["overlong"]) == (4, 2, 2, 1)
    [err] = r.errors
    assert err.kind == "parse" and "2 of 4 lines" in err.message
    append(log, "6 method=GET uri=/v3 status=200 msecs=1 rsize=1 pid=1\n")
    r = collector.collect()
    assert not r.errors and [m.tags["endpoint"] for m in r.metrics if m.name == "keystone_requests"] == ["/v3"]


def test_a_directory_replacing_the_log_is_an_error_every_round_then_read_again(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text("")
    collector = build(Config(probes={"enabled": False}, uwsgi_access_log=str(log)))
    append(log, REQ.format(ts=1795315485635))
    assert not collector.collect().errors
    os.rename(log, tmp_path / "access.log.1")
    log.mkdir()
    for _ in range(2):
        r = collector.collect()
        assert [(e.kind, e.message.split(":")[0]) for e in r.errors] == [("tool", f"cannot open {log}")]
        assert "Is a directory" in r.errors[0].message
    log.rmdir()
    append(log, REQ.format(ts=1795315485636))
    r = collector.collect()
    assert not r.errors and [m.fields["count"] for m in r.metrics if m.name == "keystone_requests"] == [1]


def test_a_fifo_at_the_path_is_an_error_not_a_hung_round(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    os.mkfifo(log)
    try:
        tail = ends_within(lambda: LogTail(log), limit_s=30)   # before: open() blocked until a writer came
        r = ends_within(tail.read_lines, limit_s=30)
        assert r.error == f"cannot open {log}: not a regular file" and r.error_kind == "tool"
    finally:
        # release an open() still blocked on it (the old code's), so no thread is left hanging
        try:
            os.close(os.open(log, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
