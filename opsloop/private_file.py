"""Reading a secret from a file: a regular file only its owner can read, read bounded.

Opened non-blocking and checked on that descriptor: a FIFO without a writer given as a password file blocked
``open()`` for ever (an IPMI collector round, every BMC behind it, never ended), ``/dev/zero`` was read until memory
ran out, and a mode checked on the name could be another file's than the one read. The callers say what the file
was for in their own words (the exceptions carry the facts).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_SECRET_FILE_BYTES = 4096   # a password or token and its trailing newlines


class PrivateFileError(ValueError):
    """The file is not a secret file we may read; subclasses say why."""


class NotRegularFile(PrivateFileError):
    pass


class OpenToOthers(PrivateFileError):
    def __init__(self, mode: int) -> None:
        super().__init__(f"mode {mode:04o}")
        self.mode = mode   # the permission bits (group or others have some)


class TooLarge(PrivateFileError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


def read_private_file(path: Path, max_bytes: int = MAX_SECRET_FILE_BYTES) -> bytes:
    """The bytes of ``path``; OSError (open, stat, read) or a :class:`PrivateFileError`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile("not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise OpenToOthers(mode)
        raw = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise TooLarge(max_bytes)
    return raw
