"""Parser for the uWSGI request log of the Keystone WSGI server (per-request timing).

Keystone logs no timing itself; uWSGI does (``%(msecs)``). Two line shapes are understood:

- the format opsloop recommends (``--logformat``, see README.md), one ``key=value`` per field::

    uwsgi_req ts_ms=%(tmsecs) method=%(method) uri=%(uri) status=%(status) msecs=%(msecs) rsize=%(rsize) pid=%(pid) addr=%(addr)

- uWSGI's stock request line, which already carries ``in N msecs``::

    [pid: 12|app: 0|req: 3/9] 127.0.0.1 () {34 vars in 456 bytes} [Sun Nov 22 02:35:17 2026] GET /v3 => generated 123 bytes in 5 msecs (HTTP/1.1 200) 4 headers in 150 bytes (1 switches on core 0)

:func:`parse_line` returns an :class:`AccessRecord` or raises :class:`LogParseError` that says
what was wrong; it never raises anything else.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

LOGFORMAT = ("uwsgi_req ts_ms=%(tmsecs) method=%(method) uri=%(uri) status=%(status) "
             "msecs=%(msecs) rsize=%(rsize) pid=%(pid) addr=%(addr)")

_OPSLOOP = re.compile(
    r"^uwsgi_req ts_ms=(?P<ts>\d{1,16}) method=(?P<method>[A-Za-z]{1,16}) uri=(?P<uri>\S{1,8192}) "
    r"status=(?P<status>\d{3}) msecs=(?P<msecs>\d{1,12}) rsize=(?P<rsize>\d{1,19}) pid=(?P<pid>\d{1,10})"
    r"(?: addr=(?P<addr>\S*))?$"
)
_STOCK = re.compile(
    r"^\[pid: (?P<pid>\d{1,10})\|app: [^|\]]*\|req: [^\]]*\] (?P<addr>\S*) \([^)]*\) \{[^}]*\} "
    r"\[(?P<ctime>[^\]]+)\] (?P<method>[A-Za-z]{1,16}) (?P<uri>\S{1,8192}) => generated (?P<rsize>\d{1,19}) bytes "
    r"in (?P<msecs>\d{1,12}) msecs \((?P<proto>[^ )]+) (?P<status>\d{3})\)"
)

_ID_SEGMENT = re.compile(r"^(?:[0-9a-fA-F]{16,}|[0-9a-fA-F-]{32,36}|\d+)$")


class LogParseError(ValueError):
    """A log line that does not have the expected shape; the message says which part failed."""


@dataclass(frozen=True, slots=True)
class AccessRecord:
    timestamp: float   # seconds since the epoch
    method: str
    endpoint: str      # path template, ids replaced by {id}, no query string
    status: int
    msecs: float
    rsize: int


def endpoint_of(uri: str) -> str:
    """``/v3/users/6f0e...c2/projects?x=1`` -> ``/v3/users/{id}/projects`` (bounded label values)."""
    path = uri.split("?", 1)[0].split("#", 1)[0] or "/"
    segments = ["{id}" if _ID_SEGMENT.match(s) else s for s in path.split("/")]
    return "/".join(segments)[:200]


def _ctime_to_epoch(text: str) -> float:
    # uWSGI writes ctime() in the server's local time zone.
    try:
        return time.mktime(time.strptime(text.strip(), "%a %b %d %H:%M:%S %Y"))
    except (ValueError, OverflowError) as e:
        raise LogParseError(f"bad request time [{text[:40]}]: {e}") from None


def parse_line(line: str) -> AccessRecord:
    line = line.rstrip("\r\n")
    if m := _OPSLOOP.match(line):
        ts = int(m["ts"]) / 1000.0
    elif m := _STOCK.match(line):
        ts = _ctime_to_epoch(m["ctime"])
    else:
        if line.startswith("uwsgi_req "):
            raise LogParseError("opsloop request line with a missing or malformed field "
                                "(expected ts_ms, method, uri, status, msecs, rsize, pid)")
        raise LogParseError("not a uWSGI request line (neither the opsloop logformat nor uWSGI's stock format)")
    status = int(m["status"])
    if not 100 <= status <= 599:
        raise LogParseError(f"status {status} is not an HTTP status")
    return AccessRecord(timestamp=ts, method=m["method"].upper(), endpoint=endpoint_of(m["uri"]),
                        status=status, msecs=float(m["msecs"]), rsize=int(m["rsize"]))
