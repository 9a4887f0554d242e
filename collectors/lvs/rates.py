"""Per-second rates from monotonically increasing LVS counters, across wraps and resets.

Counters come as 32-bit (connections and packets through ipvsadm's sockopt interface and older
kernels' /proc/net/ip_vs_stats) or 64-bit values. Bytes are 64-bit in every source (``__u64`` in
``struct ip_vs_stats_user`` and the netlink attributes, ``%16LX`` in /proc), so they are never read
as a 32-bit wrap. When a counter goes down between two reads:

* **wrap**: the previous value was in the top quarter of the 32- (or 64-) bit range and the new
  one in the bottom quarter; the increase is ``2**bits - prev + cur``;
* **reset** otherwise (``ipvsadm -Z``, the service deleted and re-added, a reboot): the counter
  restarted from zero, so the increase is ``cur`` and the round is flagged ``counter_reset``.

A rate is never negative. A series seen for the first time (or again after missing a round)
yields no rate: there is nothing to difference against.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

_W32 = 1 << 32
_W64 = 1 << 64
# 64-bit in every source: a reset bytes counter that stood between 3/4 * 2**32 and 2**32 (a service with
# 3-4 GB served) is not a 32-bit wrap (that read added up to 1 GiB to one round's rate, unflagged).
WIDE_FIELDS = frozenset({"bytes_in", "bytes_out"})


def counter_increase(prev: int, cur: int, *, wide: bool = False) -> tuple[int, bool]:
    """(increase, was_reset) between two reads of one counter; ``wide``: known to be 64-bit."""
    if cur >= prev:
        return cur - prev, False
    width = _W32 if prev < _W32 and not wide else _W64
    if prev >= width - width // 4 and cur < width // 4:
        return width - prev + cur, False
    return cur, True


@dataclass(slots=True)
class _Seen:
    at: float
    values: dict[str, int]


@dataclass(frozen=True, slots=True)
class Rates:
    per_second: dict[str, float]
    reset: bool
    interval_s: float


class RateTracker:
    """Remembers the previous counters of every series; call :meth:`end_round` after each round."""

    def __init__(self) -> None:
        self._prev: dict[Hashable, _Seen] = {}
        self._touched: set[Hashable] = set()

    def update(self, key: Hashable, values: Mapping[str, int], now: float) -> Rates | None:
        self._touched.add(key)
        prev = self._prev.get(key)
        self._prev[key] = _Seen(now, dict(values))
        if prev is None or now <= prev.at:
            return None
        dt = now - prev.at
        per_second: dict[str, float] = {}
        reset = False
        for name, cur in values.items():
            if name not in prev.values:
                continue
            inc, was_reset = counter_increase(prev.values[name], cur, wide=name in WIDE_FIELDS)
            reset |= was_reset
            per_second[name] = inc / dt
        return Rates(per_second, reset, dt)

    def end_round(self) -> None:
        """Forget series not seen this round, so one that comes back starts afresh."""
        for key in set(self._prev) - self._touched:
            del self._prev[key]
        self._touched.clear()
