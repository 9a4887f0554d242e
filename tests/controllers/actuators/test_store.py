"""The versioned weight history: bounded, survives a torn last line, names a damaged one."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.controllers.actuators.store import Entry, StoreError, WeightStore


def entry(v: int, action: str = "apply") -> Entry:
    return Entry(version=v, weights={"a": v, "b": 1}, shares={"a": 0.5, "b": 0.5}, decision={"a": 0.5, "b": 0.5},
                 action=action)


def test_bounded_history_and_high_water(tmp_path: Path) -> None:
    s = WeightStore(tmp_path, "edge/../x", "web", max_entries=5)
    assert s.last() is None and s.high_water() is None
    for v in range(1, 13):
        s.append(entry(v))
    s.append(entry(3, action="rollback"))
    assert [e.version for e in s.history()] == [9, 10, 11, 12, 3]
    assert s.high_water() == 12 and s.last().action == "rollback"
    assert s.get(11).weights == {"a": 11, "b": 1}
    assert s.path.is_relative_to(tmp_path) and ".." not in s.path.parts  # names cannot escape store_dir


def test_torn_last_line_is_ignored_damage_elsewhere_is_named(tmp_path: Path) -> None:
    s = WeightStore(tmp_path, "e", "l")
    s.append(entry(1))
    s.append(entry(2))
    with open(s.path, "ab") as f:
        f.write(b'{"version": 3, "weig')  # crash mid-write
    assert [e.version for e in s.history()] == [1, 2]
    lines = s.path.read_bytes().splitlines()
    s.path.write_bytes(b"\n".join([lines[0], b"not json", lines[1]]) + b"\n")
    with pytest.raises(StoreError, match="line 2"):
        s.history()


def test_unverified_writes_add_up_until_cleared_and_a_damaged_note_means_any(tmp_path: Path) -> None:
    """``<listener>.unverified.json``: the origins unverified writes may have set to 0, added up; gone once a
    write is verified; unreadable -> None (any 0 may be ours), and not overwritten by a narrower note."""
    s = WeightStore(tmp_path, "e", "l")
    assert s.unverified_zeroed() == set()
    s.clear_unverified()                                  # nothing owed: a no-op
    s.note_unverified({"a"}, {"a": 0, "b": 10})
    s.note_unverified({"b"}, {"a": 5, "b": 0})
    assert s.unverified_zeroed() == {"a", "b"} and s.unverified_path.stat().st_mode & 0o777 == 0o600
    assert s.history() == []                              # the history itself is untouched
    s.clear_unverified()
    assert s.unverified_zeroed() == set() and not s.unverified_path.exists()
    for damage in (b"{not json", b'{"zeroed": "a"}', b"[1]"):
        s.unverified_path.write_bytes(damage)
        assert s.unverified_zeroed() is None
        s.note_unverified({"a"}, {"a": 0})
        assert s.unverified_zeroed() is None
        s.clear_unverified()
        assert s.unverified_zeroed() == set()
