"""Incremental, rotation-safe reading of a growing log file.

Each :meth:`LogTail.read_lines` returns the complete lines appended since the previous call.
Rotation is handled the way ``tail -F`` does it:

- rename + new file (logrotate ``create``, uWSGI ``--log-reopen``): the inode at the path
  changes; we drain what is left in the old file through the descriptor we still hold, then
  open the new file from its start;
- truncation in place (logrotate ``copytruncate``): the file is shorter than our offset, or its first
  bytes are no longer the ones we read (it was truncated and grew past our offset between two reads);
  the lines written between our last read and the copy are only in the copy: we read the rest of the
  copy first when a sibling (``<name>.1``, ``<name>-20261202``, not compressed) starts with the bytes we
  read and has the bytes we last read at our offset, as Filebeat and Telegraf's tail find it by
  fingerprint; then the truncated file from its start (the copy's unterminated last line is a line: a
  writer writes a line in one write(), its rest was lost with the truncation). No such copy: counted in
  ``unrecovered``;
- the file missing: nothing to read yet (not an error until it stays missing; the caller decides);
- the file not openable (a rotation that created it ``0640 root:adm``, a directory or a FIFO at the path):
  said in ``error``, never raised (it cost the round every other source's samples, and the start a
  traceback); a FIFO is not opened at all (open() blocked the round until a writer came).

A partial last line (the writer is mid-line) is held back until its newline arrives; one longer than
MAX_LINE_BYTES is cut there and the rest of it, up to its newline, dropped (it is no line of its own).
Reads are bounded per call so that a huge backlog cannot stall a collection round.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

MAX_LINE_BYTES = 64 * 1024  # a longer "line" is not a log line: cut it so memory stays bounded
HEAD_BYTES = 1024           # a file's fingerprint: its first bytes (timestamped lines: no other file has them)
MARK_BYTES = 64             # and the last bytes we read, which a copy of it has just before our offset
MAX_CANDIDATES = 8          # rotated siblings looked at for the copy (newest first)
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".Z")


@dataclass(slots=True)
class TailResult:
    lines: list[str] = field(default_factory=list)
    rotated: int = 0          # inode changes seen
    truncated: int = 0        # in-place truncations seen
    unrecovered: int = 0      # of which no rotated copy had the rest: lines since the last read may be lost
    missing: bool = False     # the path did not exist
    overlong: int = 0         # lines cut at MAX_LINE_BYTES
    backlog: bool = False     # stopped at max_bytes with more to read
    error: str = ""           # the path exists but could not be opened or stat'ed (why)
    error_kind: str = ""      # "permission" or "tool"


class LogTail:
    """Follows one path across rotation. Not thread-safe: one reader per path."""

    def __init__(self, path: str | os.PathLike[str], start_at: Literal["end", "start"] = "end",
                 max_bytes: int = 16 * 1024 * 1024) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._start_at = start_at
        self._file: BinaryIO | None = None
        self._inode: tuple[int, int] | None = None
        self._pending = b""
        self._discard = False       # dropping the rest of a line cut at MAX_LINE_BYTES
        self._head = b""            # the first bytes of the file we follow
        self._mark = b""            # the last bytes read from it
        self._recovering = False    # self._file is the rotated copy of a truncated file: its rest first
        self._first_open = True
        # Open now: with start_at="end", "the end" is where the file was when we were created, so
        # lines written between construction and the first read are not lost.
        self._open(TailResult())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self, result: TailResult) -> bool:
        try:
            f = _open_regular(self.path)
        except FileNotFoundError:
            result.missing = True
            self._first_open = False  # a file that appears later is read from its start
            return False
        except OSError as e:   # _first_open kept: with start_at="end" its history stays unread once readable
            _note_error(result, self.path, "open", e)
            return False
        st = os.fstat(f.fileno())
        self._file, self._inode = f, (st.st_dev, st.st_ino)
        if self._first_open and self._start_at == "end":
            f.seek(0, os.SEEK_END)
        self._first_open = False
        self._pending, self._discard, self._recovering = b"", False, False
        pos = f.tell()   # the fingerprint of what we have read so far (none, or all before the end)
        self._head = os.pread(f.fileno(), HEAD_BYTES, 0)
        self._mark = os.pread(f.fileno(), min(pos, MARK_BYTES), pos - min(pos, MARK_BYTES))
        return True

    def read_lines(self) -> TailResult:
        result = TailResult()
        budget = self.max_bytes
        if self._file is None and not self._open(result):
            return result
        assert self._file is not None
        try:
            st = os.stat(self.path)
            current: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            current, st = None, None  # rotated away, new file not yet created: drain the old one
        except OSError as e:          # the directory turned unsearchable: drain what we hold, say why
            _note_error(result, self.path, "stat", e)
            current, st = None, None
        if current is not None and current == self._inode and self._truncated(st):
            result.truncated += 1
            if not self._follow_copy():
                # no copy with the rest: what was written since our last read (if anything) is lost
                result.unrecovered += 1
                self._file.seek(0)
                self._pending, self._discard, self._head, self._mark = b"", False, b"", b""
        if current is not None and current != self._inode:  # renamed away, or the truncated file's copy
            budget -= self._drain(result, budget)  # the rest of the old file first
            if budget <= 0:
                result.backlog = True
                return result  # the old file is not drained yet: switch on a later round
            self._flush_pending(result)
            self.close()
            result.rotated += not self._recovering
            self._first_open = False
            if not self._open(result):
                return result
        budget -= self._drain(result, budget)
        if budget <= 0:
            result.backlog = True
        return result

    def _truncated(self, st: os.stat_result | None) -> bool:
        """Shorter than our offset, or truncated and grown past it again: its first bytes changed."""
        assert self._file is not None
        if st is None:
            return False
        if st.st_size < self._file.tell():
            return True
        return bool(self._head) and os.pread(self._file.fileno(), len(self._head), 0) != self._head

    def _follow_copy(self) -> bool:
        """Switch to the rotated copy of our truncated file, at our offset, if a sibling is that copy."""
        assert self._file is not None
        offset = self._file.tell()
        if not self._head or offset == 0:
            return False
        try:
            names = [e for e in os.scandir(self.path.parent) if e.name != self.path.name and
                     e.name.startswith((self.path.name + ".", self.path.name + "-")) and
                     not e.name.endswith(COMPRESSED) and e.is_file()]
            names.sort(key=lambda e: e.stat().st_mtime, reverse=True)
        except OSError:
            return False
        for entry in names[:MAX_CANDIDATES]:
            try:
                f = _open_regular(Path(entry.path))
            except OSError:
                continue
            try:
                fd = f.fileno()
                st = os.fstat(fd)
                match = (st.st_size >= offset and os.pread(fd, len(self._head), 0) == self._head
                         and os.pread(fd, len(self._mark), offset - len(self._mark)) == self._mark)
            except OSError:   # removed or unreadable meanwhile: not the copy we can read
                match = False
            if match:
                f.seek(offset)
                self._file.close()
                self._file, self._inode, self._recovering = f, (st.st_dev, st.st_ino), True
                return True
            f.close()
        return False

    def _drain(self, result: TailResult, budget: int) -> int:
        assert self._file is not None
        if budget <= 0:
            return 0
        chunk = self._file.read(budget)
        if not chunk:
            return 0
        self._mark = (self._mark + chunk)[-MARK_BYTES:]
        if not self._recovering and len(self._head) < HEAD_BYTES:
            self._head = os.pread(self._file.fileno(), HEAD_BYTES, 0)
        data = self._pending + chunk
        if self._discard:   # the rest of a line cut at MAX_LINE_BYTES: no line of its own
            end = data.find(b"\n")
            if end < 0:
                self._pending = b""
                return len(chunk)
            data, self._discard = data[end + 1:], False
        *complete, self._pending = data.split(b"\n")
        if len(self._pending) > MAX_LINE_BYTES:
            result.overlong += 1
            complete.append(self._pending[:MAX_LINE_BYTES])
            self._pending, self._discard = b"", True
        for raw in complete:
            if len(raw) > MAX_LINE_BYTES:
                result.overlong += 1
                raw = raw[:MAX_LINE_BYTES]
            result.lines.append(raw.decode("utf-8", "replace").rstrip("\r"))
        return len(chunk)

    def _flush_pending(self, result: TailResult) -> None:
        # The old file will not grow any more: its unterminated last line is complete.
        if self._pending:
            result.lines.append(self._pending[:MAX_LINE_BYTES].decode("utf-8", "replace"))
            self._pending = b""
        self._discard = False


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file; OSError otherwise. Non-blocking open: a FIFO
    at the path (a misconfigured pipe logger) blocked open() until a writer came, and the round with it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
            raise OSError(code, os.strerror(code) if code == errno.EISDIR else "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _note_error(result: TailResult, path: Path, what: str, e: OSError) -> None:
    result.error = f"cannot {what} {path}: {e.strerror or e}"
    result.error_kind = "permission" if isinstance(e, PermissionError) else "tool"
