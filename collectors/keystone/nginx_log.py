"""Parser for the S3 front end's nginx access log: ``combined`` plus timing, size and S3 key id.

The ``log_format`` this expects (documented in README.md, used verbatim by the test front end)::

    log_format s3_keystone '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
                           '"$http_referer" "$http_user_agent" $request_time $request_length "$s3_access_key"';

``$s3_access_key`` comes from a ``map`` over the Authorization header (SigV4 ``Credential=KEY/...``,
SigV2 ``AWS KEY:sig``) falling back to the presigned-URL query (``X-Amz-Credential``,
``AWSAccessKeyId``), ``-`` for anonymous requests. nginx escapes ``"`` inside variables as
``\\x22``, so a quoted field never contains a bare quote.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

_LINE = re.compile(
    r'^(?P<addr>\S+) - (?P<user>\S+) \[(?P<time>[^\]]+)\] "(?P<request>[^"]*)" (?P<status>\d{3}) '
    r'(?P<bytes_sent>\d{1,19}) "(?P<referer>[^"]*)" "(?P<agent>[^"]*)" (?P<request_time>\d{1,9}(?:\.\d{1,6})?) '
    r'(?P<request_length>\d{1,19}) "(?P<access_key>[^"]*)"$'
)
_TIME = re.compile(r"^(\d{2})/([A-Z][a-z]{2})/(\d{4}):(\d{2}):(\d{2}):(\d{2}) ([+-])(\d{2})(\d{2})$")
# Locale-independent month names ($time_local is always English).
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}


class FrontendParseError(ValueError):
    """A front-end log line that does not follow the documented log_format."""


@dataclass(frozen=True, slots=True)
class FrontendRecord:
    timestamp: float
    method: str
    status: int
    body_bytes_sent: int
    request_length: int
    request_time_ms: float
    access_key: str | None   # None for anonymous (unsigned) requests

    def is_small(self, limit: int = 65536) -> bool:
        """The source document's "small" request: both body_bytes_sent and request_length below the limit."""
        return self.body_bytes_sent < limit and self.request_length < limit


def parse_time_local(text: str) -> float:
    m = _TIME.match(text)
    if not m:
        raise FrontendParseError(f"time_local {text[:40]!r} is not like 22/Nov/2026:02:35:17 +0000")
    day, mon, year, hh, mm, ss, sign, oh, om = m.groups()
    if mon not in _MONTHS:
        raise FrontendParseError(f"time_local month {mon!r} is not an English month abbreviation")
    offset = dt.timedelta(hours=int(oh), minutes=int(om)) * (1 if sign == "+" else -1)
    try:
        when = dt.datetime(int(year), _MONTHS[mon], int(day), int(hh), int(mm), int(ss),
                           tzinfo=dt.timezone(offset))
    except ValueError as e:
        raise FrontendParseError(f"time_local {text[:40]!r}: {e}") from None
    return when.timestamp()


def parse_line(line: str) -> FrontendRecord:
    line = line.rstrip("\r\n")
    m = _LINE.match(line)
    if not m:
        raise FrontendParseError("not an s3_keystone log_format line (combined + $request_time "
                                 "$request_length \"$s3_access_key\")")
    status = int(m["status"])
    if not 100 <= status <= 599:
        raise FrontendParseError(f"status {status} is not an HTTP status")
    key = m["access_key"].strip()
    method = m["request"].split(" ", 1)[0] if m["request"] not in ("", "-") else "-"
    return FrontendRecord(
        timestamp=parse_time_local(m["time"]),
        method=method[:16],
        status=status,
        body_bytes_sent=int(m["bytes_sent"]),
        request_length=int(m["request_length"]),
        request_time_ms=float(m["request_time"]) * 1000.0,
        access_key=None if key in ("", "-") else key[:128],
    )
