"""opsloop/atomic_file.py under what a crash, an operator or another process leaves next to a state file.

The temporary name (``<name>.tmp``) is fixed: whatever sits there must be replaced, never opened. A symlink
there was followed (the file it named overwritten with the state and made 0600, the target turned into a link
to it); a FIFO there blocked ``open()`` for ever (the paging book, the spool's segments: the service stalled).
The disk full is a real file-size limit (RLIMIT_FSIZE) in a child process.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from opsloop.atomic_file import replace_file, temporary_path

CHILD_TIMEOUT_S = 60   # a bound on a child that would block for ever, not a measure of speed


def test_a_symlink_in_place_of_the_temporary_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "book.json"
    target.write_bytes(b"old")
    other = tmp_path / "elsewhere" / "precious.conf"
    other.parent.mkdir()
    other.write_bytes(b"precious")
    other.chmod(0o644)
    temporary_path(target).symlink_to(other)
    replace_file(target, b"new")
    assert other.read_bytes() == b"precious"                      # not overwritten through the link
    assert stat.S_IMODE(other.stat().st_mode) == 0o644           # nor made 0600
    assert not target.is_symlink() and target.read_bytes() == b"new"
    assert stat.S_IMODE(target.lstat().st_mode) == 0o600
    assert not os.path.lexists(temporary_path(target))


def test_a_dangling_symlink_in_place_of_the_temporary_file_creates_nothing_elsewhere(tmp_path: Path) -> None:
    target = tmp_path / "overrides.json"
    nowhere = tmp_path / "not-here"
    temporary_path(target).symlink_to(nowhere)
    replace_file(target, b"{}")
    assert not os.path.lexists(nowhere)
    assert not target.is_symlink() and target.read_bytes() == b"{}"


def test_a_fifo_in_place_of_the_temporary_file_does_not_block_the_write(tmp_path: Path) -> None:
    target = tmp_path / "outbox.json"
    os.mkfifo(temporary_path(target))
    # in a child: the old code blocked in open() for ever, with no reader on the FIFO
    code = textwrap.dedent(f"""
        from pathlib import Path
        from opsloop.atomic_file import replace_file
        replace_file(Path({str(target)!r}), b"[]")
    """)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError("replace_file blocked on a FIFO under the temporary name") from None
    assert done.returncode == 0, done.stderr
    assert stat.S_ISREG(target.lstat().st_mode) and target.read_bytes() == b"[]"
    assert not os.path.lexists(temporary_path(target))


def test_a_full_disk_leaves_the_old_file_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "segment.jsonl"
    target.write_bytes(b"old")
    code = textwrap.dedent(f"""
        import errno, resource
        from pathlib import Path
        from opsloop.atomic_file import replace_file
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))   # Python ignores SIGXFSZ: write() fails EFBIG
        try:
            replace_file(Path({str(target)!r}), b"x" * 65536)
        except OSError as e:
            print(errno.errorcode[e.errno])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "EFBIG"
    assert target.read_bytes() == b"old"
    assert not os.path.lexists(temporary_path(target))
