"""Per-second rates from monotonically increasing LVS counters, across wraps and resets.

Counters come as 32-bit (connections and packets through ipvsadm's sockopt interface and older
kernels' /proc/net/ip_vs_stats) or 64-bit values. Bytes are 64-bit in every source (``__u64`` in
``struct ip_vs_stats_user`` and the netlink attributes, ``%16LX`` in /proc), so they are never read
as a 32-bit wrap. When a counter goes down between two reads:

* **wrap**: the previous value was in the top quarter of the 32- (or 64-) bit range and the new
  one in the bottom quarter, **and** none of the row's byte counters went down; the increase is
  ``2**bits - prev + cur``;
* **reset** otherwise (``ipvsadm -Z``, the service deleted and re-added, a reboot): the counter
  restarted from zero, so the increase is ``cur`` and the round is flagged ``counter_reset``.

A reset restarts every counter of the row, the 64-bit bytes too; a 32-bit wrap of connections or
packets happens while traffic, so bytes, goes on. The value alone cannot tell them apart (a 64-bit
counter that stood between 3/4 * 2**32 and 2**32 looks like a 32-bit one about to wrap): read alone,
``ipvsadm -Z`` on such a service added up to 2**32 connections to one interval, a demand spike that
moves edge weights. A drop in a row whose bytes fell (or that has none) is therefore a reset:
the worst it does is lose one interval.

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


def counter_increase(prev: int, cur: int, *, wide: bool = False, may_wrap: bool = True) -> tuple[int, bool]:
    """(increase, was_reset) between two reads of one counter; ``wide``: known to be 64-bit;
    ``may_wrap``: False when the row shows a reset (its bytes fell), so a drop is never a wrap."""
    if cur >= prev:
        return cur - prev, False
    width = _W32 if prev < _W32 and not wide else _W64
    if may_wrap and prev >= width - width // 4 and cur < width // 4:
        return width - prev + cur, False
    return cur, True


def bytes_held(prev: Mapping[str, int], cur: Mapping[str, int]) -> bool:
    """Whether a row has 64-bit byte counters and none of them fell: what a wrap of its 32-bit counters needs."""
    both = [n for n in WIDE_FIELDS if n in prev and n in cur]
    return bool(both) and all(cur[n] >= prev[n] for n in both)


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
        may_wrap = bytes_held(prev.values, values)
        for name, cur in values.items():
            if name not in prev.values:
                continue
            inc, was_reset = counter_increase(prev.values[name], cur, wide=name in WIDE_FIELDS, may_wrap=may_wrap)
            reset |= was_reset
            per_second[name] = inc / dt
        return Rates(per_second, reset, dt)

    def end_round(self) -> None:
        """Forget series not seen this round, so one that comes back starts afresh."""
        for key in set(self._prev) - self._touched:
            del self._prev[key]
        self._touched.clear()
