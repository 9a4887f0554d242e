"""HTTP replies read whole within a deadline.

requests' ``timeout`` bounds each socket read, not the reply: a server (or a proxy) that sends a byte
now and then holds a request for as long as it likes, and with it the caller (a collector's round, the
paging loop). Here the body is read one socket read at a time, each bounded by the timeout, the whole
of it by ``total_s``. (The status line and headers are still bounded per read only.)
"""

from __future__ import annotations

import time
from typing import Any

import requests
import urllib3.exceptions


def request(session: requests.Session | None, method: str, url: str, *, timeout_s: float, total_s: float,
            max_bytes: int, **kwargs: Any) -> requests.Response:
    """``session.request`` (or a one-off request) whose body is complete within ``total_s`` of its start.

    Raises requests.ReadTimeout past ``total_s``, requests.ConnectionError if the reply breaks off,
    requests.RequestException for a body over ``max_bytes``; the response's .content/.json() work."""
    started = time.monotonic()
    send = session.request if session is not None else requests.request
    resp = send(method, url, timeout=timeout_s, stream=True, **kwargs)
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            try:
                chunk = resp.raw.read1(65536)  # at most one socket read, bounded by timeout_s
            except urllib3.exceptions.ReadTimeoutError as e:
                raise requests.ReadTimeout(str(e)) from None
            except (urllib3.exceptions.ProtocolError, urllib3.exceptions.DecodeError, OSError) as e:
                raise requests.ConnectionError(str(e)) from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise requests.RequestException(f"reply from {url} is over {max_bytes} bytes")
            if resp.raw.length_remaining == 0:
                break  # its Content-Length is in: a reply complete just past the deadline is not late
            if time.monotonic() - started > total_s:
                raise requests.ReadTimeout(f"reply from {url} not complete within {total_s:g} s")
    except BaseException:
        resp.close()  # the connection is in the middle of a reply: never back to the pool
        raise
    resp.raw.release_conn()  # read to its end: the connection is kept alive for the next probe
    resp._content = b"".join(chunks)  # requests' own body cache: .content, .text and .json() read it
    resp._content_consumed = True
    return resp
