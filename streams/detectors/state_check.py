"""Checks of a detector state read back (the ``detector-state`` table after a start or a rebalance).

A state value may have been written by an older version, by a bug, or damaged on the way: a time
before 1970 or after 9999, 1e308 where a count goes, a string where a number goes, a list cut short.
Taken as it was, such a value loaded and then made every later sample of its key raise (a division
by zero, an index out of range, a number that no format can print), or put a non-finite or absurd
number into a finding. Every ``from_dict`` of a stored state checks each field with these helpers
before it builds anything, and raises :class:`StateError` naming the field: the handler then refuses
the key's state (logged, counted in ``opsloop_stream_state_dropped_total{reason="unreadable"}``) and the
key starts afresh (``opsloop.streams.agents.base.DetectorHandler.restore``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from opsloop.validation import LAST_TIME_S, is_time, shown

# The last second an RFC 3339 stamp (a finding's, an alert's startsAt) can hold: 9999-12-31T23:59:59Z.
MAX_EVENT_TIME = LAST_TIME_S
# The largest count a state holds: exact in a float, and in every JSON reader.
MAX_COUNT = 2 ** 53


class StateError(ValueError):
    """A stored state value a detector cannot use; ``field`` is its path in the state."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def obj(value: Any, field: str) -> Mapping[str, Any]:
    """``value`` when it is a JSON object (string keys)."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise StateError(field, f"expected an object, got {shown(value)}")
    return value


def get(doc: Mapping[str, Any], name: str, field: str) -> Any:
    """``doc[name]``; StateError naming ``field.name`` when it is missing."""
    try:
        return doc[name]
    except KeyError:
        raise StateError(f"{field}.{name}" if field else name, "missing") from None


def real(value: Any, field: str, lo: float = -math.inf, hi: float = math.inf, *, above: bool = False,
         below: bool = False) -> float:
    """``value`` as a float when it is a finite number in ``[lo, hi]`` (``above``: > lo; ``below``: < hi)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StateError(field, f"expected a number, got {shown(value)}")
    try:
        v = float(value)
    except OverflowError:   # an int beyond a float
        raise StateError(field, f"{shown(value)} is not a finite number") from None
    if not math.isfinite(v):
        raise StateError(field, f"{shown(value)} is not a finite number")
    if v < lo or v > hi or (above and v == lo) or (below and v == hi):
        raise StateError(field, f"{shown(value)} is out of range {'(' if above else '['}{lo:g}, {hi:g}"
                                f"{')' if below else ']'}")
    return v


def count(value: Any, field: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
    """``value`` as an int when it is a whole number in ``[lo, hi]`` (2.0 as written by a float is 2)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateError(field, f"expected a whole number, got {shown(value)}")
    if not lo <= value <= hi:
        raise StateError(field, f"{shown(value)} is out of range [{lo}, {hi}]")
    return value


def event_time(value: Any, field: str) -> float:
    """An event time: seconds since the epoch, from 1970 to the end of 9999 (what a finding can carry)."""
    if not is_time(value):
        raise StateError(field, f"{shown(value)} is not an event time (seconds from 1970 to 9999)")
    return float(value)


def text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise StateError(field, f"expected a string, got {shown(value)}")
    return value


def flag(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise StateError(field, f"expected true or false, got {shown(value)}")
    return value


def items(value: Any, field: str, max_len: int | None = None, length: int | None = None) -> list[Any]:
    """``value`` when it is a JSON array (at most ``max_len`` long, or exactly ``length``)."""
    if not isinstance(value, (list, tuple)):
        raise StateError(field, f"expected an array, got {shown(value)}")
    if length is not None and len(value) != length:
        raise StateError(field, f"expected {length} entries, got {len(value)}")
    if max_len is not None and len(value) > max_len:
        raise StateError(field, f"{len(value)} entries, more than the {max_len} it can hold")
    return list(value)


def texts(value: Any, field: str) -> dict[str, str]:
    """A JSON object of strings (labels, package versions)."""
    doc = obj(value, field)
    for k, v in doc.items():
        text(v, f"{field}[{k!r}]")
    return dict(doc)
