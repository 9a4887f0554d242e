"""Text of a series file: the error every reader of one raises, and the timestamp and value parsers
(shared by ``opsloop detect replay``, ``opsloop detect evaluate`` and streams/detectors/labelled_csv.py)."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from opsloop.streams.detectors.anomaly.model import MAX_ABS_VALUE


class ReplayError(ValueError):
    """A bad input row or header; the message names the line and the offending text."""


def parse_timestamp(text: str) -> float:
    s = text.strip()
    if not s:
        raise ValueError("empty timestamp")
    try:
        t = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(t):
            raise ValueError(f"timestamp {s!r} is not finite")
        return t
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00") if s.endswith("Z") else s)
    except ValueError:
        raise ValueError(f"timestamp {s!r} is neither epoch seconds nor ISO-8601") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def parse_value(text: str) -> float | None:
    s = text.strip()
    if not s or s.lower() in ("nan", "null", "none", "na"):
        return None
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"value {s!r} is not a number") from None
    if math.isinf(v):
        raise ValueError(f"value {s!r} is not finite")
    if abs(v) > MAX_ABS_VALUE:
        raise ValueError(f"value {s!r}: beyond ±{MAX_ABS_VALUE:g}, not a measurement the anomaly "
                         f"detector models")
    return v
