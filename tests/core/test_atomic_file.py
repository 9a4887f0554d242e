"""opsloop/atomic_file.py: the one way state files (paging book, edge overrides, spool segments) are replaced."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from opsloop import atomic_file
from opsloop.atomic_file import replace_file, temporary_path


def test_the_file_is_replaced_whole_and_private_from_creation(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    old_umask = os.umask(0o022)
    try:
        replace_file(target, b"new")
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not temporary_path(target).exists()


def test_a_temporary_file_left_wide_open_by_a_crash_is_not_reused_with_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "overrides.json"
    tmp = temporary_path(target)
    tmp.write_bytes(b'{"torn')
    tmp.chmod(0o666)
    replace_file(target, b"{}")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_bytes() == b"{}"


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "book.json"
    target.write_bytes(b"old")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(atomic_file.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        replace_file(target, b"new")
    assert target.read_bytes() == b"old" and not temporary_path(target).exists()


def test_a_failing_directory_fsync_raises_unless_the_caller_takes_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "segment.jsonl"
    monkeypatch.setattr(atomic_file, "sync_dir", lambda d: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(OSError, match="EIO"):
        replace_file(target, b"a")
    assert target.read_bytes() == b"a"            # the file is in place, its data synced
    seen: list[OSError] = []
    replace_file(target, b"b", dir_sync_failed=seen.append)
    assert target.read_bytes() == b"b" and len(seen) == 1
