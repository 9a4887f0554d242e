"""The spool's disk fills up while the broker is away.

A segment is written to a temporary file and renamed; a write that fails half-way (ENOSPC) left
that temporary file behind, and every later round left another (each takes a new sequence number):
the spool kept eating the little space there was, which only a restart gave back. A failed write
now removes its temporary file; the records are counted lost, the spool's totals stay right, and
once space is back the next round is spooled and replayed as usual.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from opsloop import atomic_file
from opsloop.collect.spool import Record, Spool


def recs(*vals: int) -> list[Record]:
    return [Record("telemetry.lb", f"k{v}", (f'{{"v":{v},"pad":"' + "x" * 200 + '"}').encode()) for v in vals]


class FullDisk:
    """``open`` whose files take the first 64 bytes of a write, then fail with ENOSPC."""

    def __init__(self) -> None:
        self.full = True

    def __call__(self, path: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        f = open(path, mode, *args, **kw)
        if not self.full or "w" not in mode:
            return f
        real_write = f.write

        def write(data: bytes) -> int:
            real_write(data[:64])
            raise OSError(errno.ENOSPC, "No space left on device")

        f.write = write
        return f


def test_a_full_disk_leaves_no_temporary_files_and_the_spool_recovers(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sp = Spool(tmp_path, max_bytes=1 << 20)
    sp.append(recs(0))
    disk = FullDisk()
    monkeypatch.setattr(atomic_file, "open", disk, raising=False)
    for v in range(1, 6):
        with pytest.raises(OSError, match="No space left"):
            sp.append(recs(v))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000000000.jsonl"], "temporary files left behind"
    assert sp.count_records() == 1 and sp.size_bytes() == (tmp_path / "000000000000.jsonl").stat().st_size
    disk.full = False                       # space is back
    sp.append(recs(6))
    got = []
    while (item := sp.oldest()) is not None:
        path, rs = item
        got += [r.key for r in rs]
        sp.complete(path, [])
    assert got == ["k0", "k6"] and sp.empty()
