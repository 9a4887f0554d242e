"""A bounded on-disk spool of Kafka records, used while the broker is unreachable.

Layout: one immutable segment file per spooled round (``<seq>.jsonl``, one record per line), in
arrival order. The drain takes the oldest segment, sends it, and deletes it, or rewrites it with
only the records that failed (atomic rename), so the spool never loses an unsent record and
replays in order. Segments are fsync'ed: a collector killed while the broker is down keeps its
spool across the restart.

Bounded: past ``max_bytes`` the oldest segments are dropped and counted
(``opsloop_spool_dropped_records_total``); monitoring data is worth less the older it is, and a
full disk on a hypervisor is worse than a gap.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import orjson


@dataclass(slots=True, frozen=True)
class Record:
    topic: str
    key: str
    value: bytes

    def to_line(self) -> bytes:
        return orjson.dumps({"t": self.topic, "k": self.key, "v": self.value.decode()}) + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> "Record":
        d = orjson.loads(line)
        return cls(d["t"], d["k"], d["v"].encode())


class Spool:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.dropped_records = 0
        self._lock = threading.Lock()
        for tmp in self.dir.glob("*.tmp"):  # a rewrite interrupted by a crash: the original is intact
            tmp.unlink(missing_ok=True)
        existing = self._segments()
        self._next_seq = (int(existing[-1].stem) + 1) if existing else 0
        # Kept in memory (scanned once here) so the gauges after every publish cost no I/O.
        self._records = sum(_count_lines(p) for p in existing)
        self._bytes = sum(p.stat().st_size for p in existing)

    def _segments(self) -> list[Path]:
        return sorted(self.dir.glob("*.jsonl"), key=lambda p: int(p.stem))

    def empty(self) -> bool:
        return self._records == 0

    def size_bytes(self) -> int:
        return self._bytes

    def count_records(self) -> int:
        return self._records

    def append(self, records: Iterable[Record]) -> None:
        lines = [r.to_line() for r in records]
        if not lines:
            return
        data = b"".join(lines)
        with self._lock:
            path = self.dir / f"{self._next_seq:012d}.jsonl"
            self._next_seq += 1
            _write_durably(path, data)
            self._records += len(lines)
            self._bytes += len(data)
            self._enforce_bound()

    def oldest(self) -> tuple[Path, list[Record]] | None:
        segs = self._segments()
        if not segs:
            return None
        path = segs[0]
        with path.open("rb") as f:
            return path, [Record.from_line(line) for line in f if line.strip()]

    def complete(self, path: Path, failed: list[Record]) -> None:
        """The segment was sent: delete it, or keep only the records that failed, in order."""
        with self._lock:
            old_records, old_bytes = _count_lines(path), path.stat().st_size
            data = b"".join(r.to_line() for r in failed)
            if failed:
                tmp = path.with_suffix(".tmp")
                _write_durably(tmp, data)
                os.replace(tmp, path)
            else:
                path.unlink(missing_ok=True)
            self._records += len(failed) - old_records
            self._bytes += len(data) - old_bytes

    def _enforce_bound(self) -> None:
        if self._bytes <= self.max_bytes:
            return
        segs = self._segments()
        # Always keep the newest segment, even if it alone exceeds the bound.
        while self._bytes > self.max_bytes and len(segs) > 1:
            victim = segs.pop(0)
            size, n = victim.stat().st_size, _count_lines(victim)
            self.dropped_records += n
            victim.unlink(missing_ok=True)
            self._records -= n
            self._bytes -= size


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
