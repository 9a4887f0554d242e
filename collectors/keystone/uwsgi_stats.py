"""Read and interpret the uWSGI stats server (``--stats``), Keystone's only server-side gauge source.

The stats server writes one JSON document and closes the connection; with ``--stats-http`` it
does the same behind an HTTP response. Addresses: ``127.0.0.1:1717`` (TCP), ``unix:/run/x.sock``
or a path starting with ``/`` (unix socket), ``http://127.0.0.1:1717`` (``--stats-http``).
``avg_rt`` is in microseconds in uWSGI's JSON; we report milliseconds.
"""

from __future__ import annotations

import json
import math
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from opsloop.bounded_http import request as bounded_request

MAX_STATS_BYTES = 8 * 1024 * 1024  # a stats document is a few KB per worker
_MAX_COUNTER = 2**64  # uWSGI keeps its counters in 64 bits: a larger number is not one of them


class StatsError(Exception):
    """Reading or interpreting the stats document failed; ``kind`` is a CollectError kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class WorkerStats:
    worker_id: int
    requests: int
    exceptions: int
    harakiri_count: int
    avg_rt_ms: float
    status: str
    respawn_count: int


@dataclass(frozen=True, slots=True)
class ServerStats:
    listen_queue: int
    listen_queue_errors: int
    workers: list[WorkerStats] = field(default_factory=list)

    @property
    def busy_workers(self) -> int:
        return sum(1 for w in self.workers if w.status == "busy")


def fetch(address: str, timeout_s: float) -> bytes:
    if address.startswith(("http://", "https://")):
        try:
            # the whole reply within timeout_s: a server trickling its body held the round
            resp = bounded_request(None, "GET", address, timeout_s=timeout_s, total_s=timeout_s,
                                   max_bytes=MAX_STATS_BYTES)
        except requests.Timeout:
            raise StatsError("timeout", f"uWSGI stats {address}: no whole reply within {timeout_s:g} s") from None
        except requests.RequestException as e:
            raise StatsError("unreachable", f"uWSGI stats {address}: {type(e).__name__}: {e}") from None
        if resp.status_code != 200:
            raise StatsError("tool", f"uWSGI stats {address}: HTTP {resp.status_code}")
        return resp.content[:MAX_STATS_BYTES]
    if address.startswith("unix:") or address.startswith("/"):
        family, target = socket.AF_UNIX, address.removeprefix("unix:")
    else:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise StatsError("tool", f"uWSGI stats address {address!r} is not HOST:PORT, unix:PATH or http://")
        family, target = socket.AF_INET6 if ":" in host else socket.AF_INET, (host.strip("[]"), int(port))
    chunks: list[bytes] = []
    size = 0
    # Each recv is bounded by the socket timeout, the document by the deadline: a server sending a
    # byte now and then held the round for as long as it liked.
    deadline = time.monotonic() + timeout_s
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(target)
            while size < MAX_STATS_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StatsError("timeout", f"uWSGI stats {address}: no whole document within {timeout_s:g} s")
                s.settimeout(left)
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except socket.timeout:
        raise StatsError("timeout", f"uWSGI stats {address}: no whole document within {timeout_s:g} s") from None
    except OSError as e:
        raise StatsError("unreachable", f"uWSGI stats {address}: {type(e).__name__}: {e}") from None
    return b"".join(chunks)


def _int(d: dict[str, Any], key: str, where: str) -> int:
    v = d.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise StatsError("parse", f"uWSGI stats {where}.{key} is {v!r}, not a number")
    # json.loads reads NaN, Infinity and 1e400 as floats that int() refuses; uWSGI's counters are 64-bit.
    if isinstance(v, float) and not math.isfinite(v):
        raise StatsError("parse", f"uWSGI stats {where}.{key} is {v!r}, not a finite number")
    if abs(v) >= _MAX_COUNTER:
        shown = f"{v:.3g}" if isinstance(v, float) else f"an integer of {v.bit_length()} bits"
        raise StatsError("parse", f"uWSGI stats {where}.{key} is {shown}, beyond a 64-bit counter")
    return int(v)


def parse(raw: bytes) -> ServerStats:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise StatsError("parse", f"uWSGI stats is not JSON ({e}); starts with {raw[:80]!r}") from None
    except RecursionError:
        # A hostile or broken server's "[[[[..." is nested deeper than the decoder's stack.
        raise StatsError("parse", f"uWSGI stats JSON is nested too deeply to read; starts with {raw[:80]!r}") from None
    if not isinstance(doc, dict):
        raise StatsError("parse", f"uWSGI stats is a JSON {type(doc).__name__}, expected an object")
    workers_raw = doc.get("workers")
    if not isinstance(workers_raw, list):
        raise StatsError("parse", "uWSGI stats has no 'workers' list")
    workers = []
    for i, w in enumerate(workers_raw):
        if not isinstance(w, dict):
            raise StatsError("parse", f"uWSGI stats workers[{i}] is not an object")
        where = f"workers[{i}]"
        workers.append(WorkerStats(
            worker_id=_int(w, "id", where),
            requests=_int(w, "requests", where),
            exceptions=_int(w, "exceptions", where),
            harakiri_count=_int(w, "harakiri_count", where),
            avg_rt_ms=_int(w, "avg_rt", where) / 1000.0,
            status=str(w.get("status", "unknown"))[:32],
            respawn_count=_int(w, "respawn_count", where),
        ))
    return ServerStats(listen_queue=_int(doc, "listen_queue", "stats"),
                       listen_queue_errors=_int(doc, "listen_queue_errors", "stats"),
                       workers=workers)
