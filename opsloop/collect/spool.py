"""A bounded on-disk spool of Kafka records, used while the broker is unreachable.

Layout: one immutable segment file per spooled round (``<seq>.jsonl``, one record per line), in
arrival order. The drain takes the oldest segment, sends it, and deletes it, or rewrites it with
only the records that failed, so the spool never loses an unsent record and replays in order.

Crash safety: a segment is written to ``<seq>.jsonl.tmp``, fsync'ed, renamed to its final name and the
directory fsync'ed, so a collector killed mid-write leaves the old spool plus a temp file (removed
at the next start), never a torn segment. A segment that is damaged anyway (a disk error, a file
from elsewhere) does not stop the collector: each line that does not decode is moved to
``quarantine/<segment>.bad`` and counted (``quarantined_lines``), the good lines are replayed, and
a file in the spool directory that is not a segment is quarantined whole.

Bounded: past ``max_bytes`` the oldest segments are dropped and counted
(``opsloop_spool_dropped_records_total``); monitoring data is worth less the older it is, and a
full disk on a hypervisor is worse than a gap. A spool directory removed while running is made again
by the next write, the records that went with it counted dropped as well.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import orjson

from opsloop.atomic_file import replace_file, sync_dir
from opsloop.log import get_logger

log = get_logger("spool")

_SEGMENT = re.compile(r"^\d{1,20}\.jsonl$")
QUARANTINE_DIR = "quarantine"
QUARANTINE_MAX_BYTES = 16 * 1024 * 1024   # kept for inspection; beyond this only counted


@dataclass(slots=True, frozen=True)
class Record:
    topic: str
    key: str
    value: bytes

    def to_line(self) -> bytes:
        return orjson.dumps({"t": self.topic, "k": self.key, "v": self.value.decode()}) + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> "Record":
        """ValueError when the line is not a spooled record."""
        try:
            d = orjson.loads(line)
            rec = cls(d["t"], d["k"], d["v"].encode())
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeError) as e:
            raise ValueError(f"not a spooled record: {type(e).__name__}: {e}") from None
        if not (isinstance(rec.topic, str) and isinstance(rec.key, str)):
            raise ValueError("not a spooled record: topic and key must be strings")
        return rec


class Spool:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.dropped_records = 0
        self.quarantined_lines = 0
        self._lock = threading.Lock()
        for tmp in self.dir.glob("*.tmp"):  # a write interrupted by a crash: the originals are intact
            try:
                tmp.unlink(missing_ok=True)
            except OSError:   # not a file (a directory): moved aside, not a crash at every start
                self._quarantine_file(tmp)
        for stray in self.dir.glob("*.jsonl"):
            if not _SEGMENT.match(stray.name):
                self._quarantine_file(stray)
        existing = self._segments()
        self._next_seq = (int(existing[-1].stem) + 1) if existing else 0
        # Kept in memory (scanned once here) so the gauges after every publish cost no I/O.
        self._records = 0
        self._bytes = 0
        for segment in existing:
            try:
                lines, size = _count_lines(segment), segment.stat().st_size
            except OSError as e:
                # unreadable (a disk error, not a file): quarantined as oldest() does when sending; raised here,
                # it stopped the collector at every start, the good segments with it
                log.error("spool_segment_unreadable", segment=segment.name, error=str(e))
                self._quarantine_file(segment)
                continue
            self._records += lines
            self._bytes += size

    def _segments(self) -> list[Path]:
        return sorted((p for p in self.dir.glob("*.jsonl") if _SEGMENT.match(p.name)), key=lambda p: int(p.stem))

    def empty(self) -> bool:
        return self._records == 0

    def size_bytes(self) -> int:
        return self._bytes

    def count_records(self) -> int:
        return self._records

    def reserve(self) -> int:
        """A sequence number for a round not written yet: written later under it (``append(seq=)``), the
        round sorts before every segment appended after the reservation, so a round that was sent from
        memory and failed is replayed in its place, ahead of the rounds spooled while it was in flight."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            return seq

    def first_seq(self) -> int | None:
        """The sequence number of the oldest segment, None when there is none."""
        segs = self._segments()
        return int(segs[0].stem) if segs else None

    def append(self, records: Iterable[Record], seq: int | None = None) -> None:
        """Write ``records`` as one segment, durably, under ``seq`` (from :meth:`reserve`) or the next."""
        lines = [r.to_line() for r in records]
        if not lines:
            return
        data = b"".join(lines)
        with self._lock:
            if seq is None:
                seq = self._next_seq
                self._next_seq += 1
            path = self.dir / f"{seq:012d}.jsonl"
            try:
                _replace_segment(path, data)
            except FileNotFoundError:
                if self.dir.is_dir():
                    raise
                self._recreate_dir()
                _replace_segment(path, data)
            self._records += len(lines)
            self._bytes += len(data)
            self._enforce_bound()

    def oldest(self) -> tuple[Path, list[Record]] | None:
        """The oldest segment and its records; lines that do not decode are quarantined on the way."""
        while True:
            segs = self._segments()
            if not segs:
                with self._lock:
                    if not self._segments():   # not an append landing meanwhile
                        # Nothing left, so the totals are 0 whatever drift a write that failed after its
                        # rename or an unreadable segment left in them: else empty() stays False and the
                        # sender loops on an empty spool without a pause.
                        self._records = 0
                        self._bytes = 0
                return None
            path = segs[0]
            try:
                with path.open("rb") as f:
                    lines = [line for line in f if line.strip()]
            except FileNotFoundError:   # dropped by the bound (a round appended meanwhile): the next one
                continue
            except OSError as e:
                log.error("spool_segment_unreadable", segment=path.name, error=str(e))
                with self._lock:
                    self._quarantine_file(path)
                continue
            records: list[Record] = []
            bad: list[bytes] = []
            for line in lines:
                try:
                    records.append(Record.from_line(line))
                except ValueError:
                    bad.append(line)
            if not bad:
                return path, records
            with self._lock:
                if not path.exists():   # dropped by the bound meanwhile
                    continue
                self._quarantine_lines(path, bad)
                self._rewrite(path, records, len(lines))
            if records:
                return path, records

    def complete(self, path: Path, failed: list[Record]) -> None:
        """The segment was sent: delete it, or keep only the records that failed, in order. A segment
        the bound dropped while it was being sent is gone already (its records counted as dropped)."""
        with self._lock:
            if path.exists():
                self._rewrite(path, failed, _count_lines(path))

    def _rewrite(self, path: Path, keep: list[Record], old_records: int) -> None:
        """Replace a segment by ``keep`` (delete it when empty), keeping the in-memory totals right."""
        old_bytes = path.stat().st_size
        data = b"".join(r.to_line() for r in keep)
        if keep:
            _replace_segment(path, data)
        else:
            path.unlink(missing_ok=True)
            sync_dir(self.dir)
        self._records += len(keep) - old_records
        self._bytes += len(data) - old_bytes

    def _recreate_dir(self) -> None:
        """The spool directory was removed under us (a tmpfiles or an operator's clean-up): every later write
        failed until a restart, so an outage's rounds were lost past the publisher's memory. Made again; the
        segments that went with it are counted dropped (the totals still held them)."""
        gone = self._records
        log.error("spool_dir_recreated", dir=str(self.dir), lost_records=gone,
                  error="the spool directory was removed while running; its segments are lost")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dropped_records += gone
        self._records = 0
        self._bytes = 0

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


    def _quarantine_lines(self, segment: Path, lines: list[bytes]) -> None:
        self.quarantined_lines += len(lines)
        log.error("spool_lines_quarantined", segment=segment.name, lines=len(lines),
                  first=lines[0][:120].decode("utf-8", "backslashreplace"))
        qdir = self._quarantine_dir()
        if qdir is None:
            return
        with open(qdir / f"{segment.name}.bad", "ab") as f:
            f.write(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines))

    def _quarantine_file(self, path: Path) -> None:
        try:
            n = _count_lines(path) if path.is_file() else 0
        except OSError:   # unreadable, which may be why it is quarantined: raising here kept it first forever
            n = 0
        self.quarantined_lines += n
        log.error("spool_file_quarantined", file=path.name, lines=n)
        qdir = self._quarantine_dir()
        try:
            if qdir is not None:
                os.replace(path, qdir / f"{path.name}.bad")
            else:
                path.unlink(missing_ok=True)
        except OSError as e:
            log.error("spool_quarantine_failed", file=path.name, error=str(e))
            path.unlink(missing_ok=True)

    def _quarantine_dir(self) -> Path | None:
        """The quarantine directory, or None when it already holds QUARANTINE_MAX_BYTES."""
        qdir = self.dir / QUARANTINE_DIR
        qdir.mkdir(exist_ok=True)
        if sum(p.stat().st_size for p in qdir.iterdir() if p.is_file()) >= QUARANTINE_MAX_BYTES:
            return None
        return qdir


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _replace_segment(path: Path, data: bytes) -> None:
    """Write a segment as a whole or not at all; a failing directory fsync is logged, not raised (the
    segment is in place, its data synced: raising would leave it uncounted)."""
    replace_file(path, data, dir_sync_failed=lambda e: log.error(
        "spool_dir_fsync_failed", segment=path.name, error=str(e)))
