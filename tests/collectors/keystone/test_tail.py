"""LogTail: incremental reads that survive rename-rotation, copytruncate and partial lines."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.collectors.keystone.tail import MAX_LINE_BYTES, LogTail


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_start_at_end_skips_history_then_follows(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("old 1\nold 2\n")
    tail = LogTail(log, start_at="end")
    assert tail.read_lines().lines == []
    append(log, "new 1\nnew 2\n")
    assert tail.read_lines().lines == ["new 1", "new 2"]
    assert tail.read_lines().lines == []


def test_start_at_start_reads_history(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("old 1\nold 2\n")
    assert LogTail(log, start_at="start").read_lines().lines == ["old 1", "old 2"]


def test_partial_line_waits_for_its_newline(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    tail = LogTail(log)
    append(log, "first\nsec")
    assert tail.read_lines().lines == ["first"]
    append(log, "ond\n")
    assert tail.read_lines().lines == ["second"]


def test_rename_rotation_drains_old_file_then_reads_new(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    tail = LogTail(log)
    append(log, "a1\n")
    assert tail.read_lines().lines == ["a1"]
    append(log, "a2\na3-unterminated")        # written after our read, before rotation
    os.rename(log, tmp_path / "a.log.1")      # logrotate's "create" mode
    append(log, "b1\n")                        # the writer reopened: new inode
    result = tail.read_lines()
    assert result.lines == ["a2", "a3-unterminated", "b1"]
    assert result.rotated == 1
    append(log, "b2\n")
    assert tail.read_lines().lines == ["b2"]


def test_rotated_away_without_new_file_keeps_draining(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    tail = LogTail(log)
    tail.read_lines()
    append(log, "x\n")
    os.rename(log, tmp_path / "a.log.1")
    result = tail.read_lines()
    assert result.lines == ["x"] and result.rotated == 0


def test_copytruncate_restarts_from_the_top(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    tail = LogTail(log)
    append(log, "one\ntwo\nthree\n")
    assert len(tail.read_lines().lines) == 3
    with open(log, "w"):
        pass                                   # truncate in place, same inode
    append(log, "four\n")
    result = tail.read_lines()
    assert result.truncated == 1 and result.lines == ["four"]


def test_missing_file_is_reported_and_later_read_from_its_start(tmp_path):
    log = tmp_path / "late.log"
    tail = LogTail(log, start_at="end")
    assert tail.read_lines().missing
    append(log, "early line\n")
    assert tail.read_lines().lines == ["early line"]


def test_unopenable_path_is_an_error_not_a_raise_and_is_read_once_it_opens(tmp_path):
    log = tmp_path / "a.log"
    log.mkdir()                                # a directory where the log should be: open() fails
    tail = LogTail(log, start_at="start")      # used to raise here (and the collector's start with it)
    r = tail.read_lines()
    assert r.error.startswith(f"cannot open {log}") and r.error_kind == "tool" and not r.missing and not r.lines
    log.rmdir()
    append(log, "first\n")
    r = tail.read_lines()
    assert r.lines == ["first"] and not r.error


def test_budget_bounds_one_read_and_the_rest_comes_later(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    tail = LogTail(log, max_bytes=4096)
    lines = [f"line {i:05d}" for i in range(2000)]
    append(log, "\n".join(lines) + "\n")
    first = tail.read_lines()
    assert first.backlog and 0 < len(first.lines) < 2000
    got = list(first.lines)
    while True:
        r = tail.read_lines()
        got += r.lines
        if not r.backlog:
            break
    assert got == lines


def test_overlong_lines_are_cut(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    tail = LogTail(log)
    append(log, "x" * (MAX_LINE_BYTES + 10) + "\nshort\n")
    result = tail.read_lines()
    assert result.overlong == 1 and len(result.lines[0]) == MAX_LINE_BYTES and result.lines[1] == "short"


line_text = st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(line_text, max_size=30), cuts=st.lists(st.integers(0, 10_000), max_size=6),
       rotate_at=st.one_of(st.none(), st.integers(0, 6)))
def test_any_write_pattern_yields_exactly_the_lines_written(tmp_path_factory, lines, cuts, rotate_at):
    d = tmp_path_factory.mktemp("fuzz")
    log = d / "f.log"
    log.write_text("")
    tail = LogTail(log)
    data = "".join(line + "\n" for line in lines)
    points = sorted({min(c, len(data)) for c in cuts} | {len(data)})
    got: list[str] = []
    start = 0
    for i, p in enumerate(points):
        if rotate_at == i and (start == 0 or data[start - 1] == "\n"):  # writers rotate between lines
            os.rename(log, d / f"f.log.{i}")
            log.write_text("")
        append(log, data[start:p])
        start = p
        got += tail.read_lines().lines
    got += tail.read_lines().lines
    assert got == lines
