"""Bounded per-key state of the stream handlers: a TTL and a cap, drops counted, gauge children removed.

A handler that keeps something per host, series or server must not keep every key it ever saw
(3,000 servers replaced over a year would stay in memory and on /metrics). :class:`Recency` tracks
when each key was last seen (receive time, so a sample stamped in the future cannot keep a key
alive) and says which keys to drop: silent for ``ttl_s`` (reason ``ttl``), or the least recently
seen beyond ``cap`` keys (reason ``cap``). The handler then forgets the key, removes its gauge
children (:func:`drop_children`) and counts it in ``opsloop_stream_state_dropped_total``.
"""

from __future__ import annotations

from typing import Collection, Generic, Hashable, TypeVar

from prometheus_client import Counter, Gauge

STATE_DROPPED = Counter("opsloop_stream_state_dropped_total",
                        "State keys a stream handler dropped (ttl: silent too long; cap: too many keys; "
                        "unreadable: its stored state refused at a restore; too_large: a write over the producer's record "
                        "limit, kept in memory only)", ["handler", "reason"])
UNREADABLE = "unreadable"   # the reason of a stored state a handler refused (opsloop.streams.agents.base)
STATE_KEYS = Gauge("opsloop_stream_state_keys", "State keys a stream handler holds", ["handler"])

# Defaults of the stream section (opsloop.config.StreamSettings), for handlers built without settings.
DEFAULT_STATE_TTL_S = 3600.0
DEFAULT_MAX_STATE_KEYS = 20_000
SWEEP_EVERY_S = 1.0

K = TypeVar("K", bound=Hashable)


class Recency(Generic[K]):
    """Last-seen time per key, least recently seen first; :meth:`expired` pops what must go."""

    def __init__(self, ttl_s: float = DEFAULT_STATE_TTL_S, cap: int = DEFAULT_MAX_STATE_KEYS) -> None:
        self.ttl_s = ttl_s
        self.cap = cap
        self._seen: dict[K, float] = {}
        self._last_sweep = float("-inf")

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, key: object) -> bool:
        return key in self._seen

    def keys(self) -> list[K]:
        """The keys held, least recently seen first."""
        return list(self._seen)

    def seen(self, key: K, now: float) -> None:
        self._seen.pop(key, None)   # re-inserted at the end: dict order is recency order
        self._seen[key] = now

    def discard(self, key: K) -> None:
        self._seen.pop(key, None)

    def clear(self) -> None:
        self._seen.clear()

    def expired(self, now: float) -> list[tuple[K, str]]:
        """Pop and return (key, "ttl"|"cap") for every key to drop now (a sweep at most once a second
        unless over the cap)."""
        over = len(self._seen) - self.cap
        if over <= 0 and now - self._last_sweep < SWEEP_EVERY_S:
            return []
        self._last_sweep = now
        out: list[tuple[K, str]] = []
        for key, seen in self._seen.items():    # least recently seen first
            if over > 0:
                out.append((key, "cap"))
                over -= 1
            elif now - seen > self.ttl_s:
                out.append((key, "ttl"))
            else:
                break
        for key, _ in out:
            del self._seen[key]
        return out


def count_dropped(handler: str, dropped: list[tuple[K, str]]) -> None:
    for _, reason in dropped:
        STATE_DROPPED.labels(handler, reason).inc()


def drop_children(gauge: Gauge, label: str, values: Collection[str]) -> int:
    """Remove every child of ``gauge`` whose ``label`` is one of ``values`` (one pass); returns how many."""
    if not values:
        return 0
    i = list(gauge._labelnames).index(label)  # noqa: SLF001 - prometheus_client has no "remove where"
    with gauge._lock:  # noqa: SLF001
        victims = [labels for labels in gauge._metrics if labels[i] in values]  # noqa: SLF001
    for labels in victims:
        try:
            gauge.remove(*labels)
        except KeyError:
            pass
    return len(victims)
