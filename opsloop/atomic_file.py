"""Replace a file as a whole or not at all, durably: the one way state files are written.

A temporary file next to the target (``<name>.tmp``, so a crash leaves the old file and a temporary
file a loader ignores), written and fsync'ed, renamed over the target, then the directory fsync'ed
so the rename itself survives a power cut. The temporary file is created with its final ``mode``
(0600 by default: state files may name hosts and incidents; a file holding secrets must never be
readable by others, not even for the moment before a chmod), exclusively after removing whatever was left
under its name (a symlink or a FIFO there is never opened), and removed when the write fails (a full
disk: a half-written temporary file per call would eat what space is left). One writer per target
at a time (callers hold their own lock): the temporary name is fixed, not unique.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable


def temporary_path(path: Path) -> Path:
    """Where :func:`replace_file` writes before the rename."""
    return path.with_name(path.name + ".tmp")


def replace_file(path: Path, data: bytes, mode: int = 0o600,
                 dir_sync_failed: Callable[[OSError], None] | None = None) -> None:
    """Write ``data`` to ``path`` atomically and durably (module docstring). A failing directory fsync
    raises unless ``dir_sync_failed`` takes it (the file is in place, its data synced)."""
    tmp = temporary_path(path)
    try:
        # Whatever a crash or someone else left under the temporary name is removed, never opened: a symlink
        # there was followed (another file overwritten, made 0600, and the target became a link to it), a FIFO
        # blocked open() for ever. Created anew, exclusively: nothing can be slipped in between.
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with open(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)   # exactly ``mode``: the umask may have taken bits of it
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):   # the write's own error is the one to report
            tmp.unlink(missing_ok=True)
        raise
    try:
        sync_dir(path.parent)
    except OSError as e:
        if dir_sync_failed is None:
            raise
        dir_sync_failed(e)


def sync_dir(directory: Path) -> None:
    """fsync a directory: a rename, creation or unlink in it survives a power cut."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
