"""When a target set is due, and the guard that keeps measurements from overlapping.

A throughput measurement costs R x run_s of saturated links, so each set has its own cadence
(``interval_s`` plus a random ``jitter_s``, so that a fleet of collectors restarted together does
not measure the same targets at the same moment), independent of how often the runtime calls
``collect()``. Two measurements on one host at once would each see the other's traffic, so rounds
never overlap: within a process (a lock) and, with ``lock_file``, across processes (flock).
"""

from __future__ import annotations

import fcntl
import os
import random
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator


class JitterSchedule:
    """Due at once the first time; afterwards ``interval_s`` + uniform(0, ``jitter_s``) after the last
    measurement *ended*, so a slow measurement never makes the next one start early."""

    def __init__(self, interval_s: float | None, jitter_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self.interval_s = interval_s
        self.jitter_s = jitter_s
        self._clock = clock
        self._rng = rng or random.Random()
        self.next_due: float | None = None

    def due(self) -> bool:
        return self.next_due is None or self._clock() >= self.next_due

    def done(self) -> None:
        if self.interval_s is None:
            return  # measured every round
        self.next_due = self._clock() + self.interval_s + (self._rng.uniform(0, self.jitter_s) if self.jitter_s else 0)


class RoundGuard:
    """Non-blocking exclusion: ``hold()`` yields False instead of waiting when a round is running."""

    def __init__(self, lock_file: str | None = None) -> None:
        self._lock = threading.Lock()
        self._lock_file = lock_file

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    @contextmanager
    def hold(self) -> Iterator[bool]:
        if not self._lock.acquire(blocking=False):
            yield False
            return
        try:
            if self._lock_file is None:
                yield True
                return
            fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield False
                    return
                yield True
            finally:
                os.close(fd)  # closing releases the flock
        finally:
            self._lock.release()
