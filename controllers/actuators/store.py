"""Versioned history of applied weights per listener and edge: JSON lines on disk, bounded.

One file per (edge, listener): ``<store_dir>/<edge>/<listener>.jsonl``, one entry per apply or
rollback. It answers "which version is live" (idempotence: the same version again is a no-op, an
older one is refused) and "what was live before" (rollback). Writers (the service and the
``opsloop weights`` CLI) take an exclusive ``flock`` so an entry is never interleaved; the file is
compacted to the newest ``history_max`` entries by an atomic rewrite.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator
from contextlib import contextmanager

import orjson

_SAFE = re.compile(r"[^A-Za-z0-9_.\-]")


class StoreError(ValueError):
    """The history file is unreadable; the message names the file and line."""


@dataclass
class Entry:
    version: int                       # decision version (a rollback: the version rolled back to)
    weights: dict[str, int]            # integer weights written
    shares: dict[str, float]           # shares applied (after the step bound)
    decision: dict[str, float]         # shares the decision asked for
    complete: bool = True              # False: step-bounded, the decision is not fully reached
    action: str = "apply"              # "apply" (a decision), "manual" (operator apply) or "rollback"
    applied_at: float = field(default_factory=time.time)
    computed_at: float | None = None
    reason: str = ""

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Entry":
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


def _safe(name: str) -> str:
    return _SAFE.sub("_", name) or "_"


class WeightStore:
    def __init__(self, root: Path, edge: str, listener: str, max_entries: int = 200) -> None:
        self.path = Path(root) / _safe(edge) / f"{_safe(listener)}.jsonl"
        self.max_entries = max_entries

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> list[Entry]:
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return []
        entries = []
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entries.append(Entry.from_dict(orjson.loads(line)))
            except (orjson.JSONDecodeError, TypeError, KeyError) as e:
                if i == len(text.splitlines()):
                    continue  # a torn last line (crash mid-write): the entry never completed
                raise StoreError(f"{self.path} line {i}: not a history entry ({e})") from None
        return entries

    def history(self) -> list[Entry]:
        with self._locked():
            return self._read()

    def last(self) -> Entry | None:
        h = self.history()
        return h[-1] if h else None

    def high_water(self) -> int | None:
        """The highest decision version applied (rollbacks do not lower it)."""
        versions = [e.version for e in self.history() if e.action == "apply"]
        return max(versions) if versions else None

    def get(self, version: int) -> Entry | None:
        for e in reversed(self.history()):
            if e.version == version:
                return e
        return None

    def append(self, entry: Entry) -> None:
        with self._locked():
            with open(self.path, "ab") as f:
                f.write(orjson.dumps(asdict(entry)) + b"\n")
                f.flush()
                os.fsync(f.fileno())
            entries = self._read()
            if len(entries) > self.max_entries:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_bytes(b"".join(orjson.dumps(asdict(e)) + b"\n" for e in entries[-self.max_entries:]))
                os.replace(tmp, self.path)  # atomic: the old or the new history, never half
