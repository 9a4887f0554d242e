"""Incremental, rotation-safe reading of a growing log file.

Each :meth:`LogTail.read_lines` returns the complete lines appended since the previous call.
Rotation is handled the way ``tail -F`` does it:

- rename + new file (logrotate ``create``, uWSGI ``--log-reopen``): the inode at the path
  changes; we drain what is left in the old file through the descriptor we still hold, then
  open the new file from its start;
- truncation in place (logrotate ``copytruncate``): the file is shorter than our offset; we
  restart from its start;
- the file missing: nothing to read yet (not an error until it stays missing; the caller decides);
- the file not openable (a rotation that created it ``0640 root:adm``, a directory at the path): said in
  ``error``, never raised (it cost the round every other source's samples, and the start a traceback).

A partial last line (the writer is mid-line) is held back until its newline arrives. Reads are
bounded per call so that a huge backlog cannot stall a collection round.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

MAX_LINE_BYTES = 64 * 1024  # a longer "line" is not a log line: cut it so memory stays bounded


@dataclass(slots=True)
class TailResult:
    lines: list[str] = field(default_factory=list)
    rotated: int = 0          # inode changes seen
    truncated: int = 0        # in-place truncations seen
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
            f = open(self.path, "rb")
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
        self._pending = b""
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
        if current is not None and current != self._inode:
            budget -= self._drain(result, budget)  # the rest of the old file first
            if budget <= 0:
                result.backlog = True
                return result  # the old file is not drained yet: switch on a later round
            self._flush_pending(result)
            self.close()
            result.rotated += 1
            self._first_open = False
            if not self._open(result):
                return result
        elif st is not None and st.st_size < self._file.tell():
            result.truncated += 1
            self._file.seek(0)
            self._pending = b""
        budget -= self._drain(result, budget)
        if budget <= 0:
            result.backlog = True
        return result

    def _drain(self, result: TailResult, budget: int) -> int:
        assert self._file is not None
        if budget <= 0:
            return 0
        chunk = self._file.read(budget)
        if not chunk:
            return 0
        data = self._pending + chunk
        *complete, self._pending = data.split(b"\n")
        if len(self._pending) > MAX_LINE_BYTES:
            result.overlong += 1
            complete.append(self._pending[:MAX_LINE_BYTES])
            self._pending = b""
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


def _note_error(result: TailResult, path: Path, what: str, e: OSError) -> None:
    result.error = f"cannot {what} {path}: {e.strerror or e}"
    result.error_kind = "permission" if isinstance(e, PermissionError) else "tool"
