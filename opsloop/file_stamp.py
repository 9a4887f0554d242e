"""What tells that a file changed without reading it: one stat, for files re-checked while a service runs
(the edge API's token file, the edge topology file)."""

from __future__ import annotations

import os
from pathlib import Path

# (dev, ino, size, mtime_ns, ctime_ns), or the stat's error: a file replaced, rewritten or chmod-ed (ctime: a
# chmod changes neither size nor mtime) gives another stamp, and so does a file that went missing
FileStamp = tuple[int, int, int, int, int] | str


def file_stamp(path: Path) -> FileStamp:
    try:
        st = os.stat(path)
    except OSError as e:
        return f"stat: {e.strerror}"
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
