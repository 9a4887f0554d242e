"""Text of a series file: the error every reader of one raises, and the timestamp and value parsers
(shared by ``opsloop detect replay``, ``opsloop detect evaluate`` and streams/detectors/labelled_csv.py)."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from opsloop.streams.detectors.anomaly.model import MAX_ABS_VALUE


class ReplayError(ValueError):
    """A bad input row or header; the message names the line and the offending text."""


# Epoch numbers beyond 1e11 seconds (year 5138) are milliseconds (Grafana's CSV export), microseconds or
# nanoseconds (InfluxDB, Telegraf): read as seconds they put every step 1,000x apart (no daily profile)
# and the plot raised. (divisor, where the unit starts)
EPOCH_UNITS = ((1e9, 1e17), (1e6, 1e14), (1e3, 1e11))
# what a datetime can show (year 1 to the end of 9999): beyond it a timestamp is not a time
MIN_EPOCH_S, MAX_EPOCH_S = -62135596800.0, 253402300799.0


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
        for div, start in EPOCH_UNITS:
            if abs(t) >= start:
                t /= div
                break
        if not MIN_EPOCH_S <= t <= MAX_EPOCH_S:
            raise ValueError(f"timestamp {s!r} is beyond year 9999 as epoch seconds, ms, us or ns")
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
