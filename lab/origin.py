"""A toy origin server: answers 200 up to its capacity (requests/s), 503 above it, with a latency.

    python -m opsloop.lab.origin --port 8081 --capacity 200 --latency-ms 20 --health-file /tmp/near.health

``GET /health`` answers 503 while the health file contains ``down`` (tests flip health by writing
the file: no command interface to authenticate). Counters are at ``GET /stats`` (JSON): ``ok``,
``rejected`` (over capacity) and ``client_resets`` (connections the client reset or dropped: HAProxy ends
every health check with a reset; counted, not logged).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson


class TokenBucket:
    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = rate
        self.capacity = burst if burst is not None else max(1.0, rate / 5)
        self.tokens = self.capacity
        self.t = time.monotonic()
        self.lock = threading.Lock()

    def take(self) -> bool:
        if self.rate <= 0:
            return True
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.t) * self.rate)
            self.t = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            return False


def make_handler(name: str, bucket: TokenBucket, latency_s: float, health_file: Path | None,
                 stats: dict[str, int], lock: threading.Lock | None = None) -> type[BaseHTTPRequestHandler]:
    lock = lock or threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet: counters tell the story
            pass

        def _reply(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.path == "/health":
                down = health_file is not None and health_file.exists() and "down" in health_file.read_text()
                self._reply(503 if down else 200, b'{"health":"%s"}' % (b"down" if down else b"up"))
                return
            if self.path == "/stats":
                with lock:
                    self._reply(200, orjson.dumps(stats))
                return
            if bucket.take():
                if latency_s:
                    time.sleep(latency_s)
                with lock:
                    stats["ok"] += 1
                self._reply(200, b'{"origin":"%s"}' % name.encode())
            else:
                with lock:
                    stats["rejected"] += 1
                self._reply(503, b'{"error":"over capacity"}')

    return Handler


class OriginServer(ThreadingHTTPServer):
    """Quiet about clients that go away: HAProxy closes each health check with a reset, which socketserver
    printed as a 20-line traceback (about one a second per origin: `make run`'s origin logs grew by MBs
    an hour). Counted in ``stats["client_resets"]``; any other error is still printed."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 stats: dict[str, int], lock: threading.Lock) -> None:
        super().__init__(address, handler)
        self.stats = stats
        self.stats_lock = lock   # the handler's: /stats reads every counter under it

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):   # reset, broken pipe, aborted
            with self.stats_lock:
                self.stats["client_resets"] += 1
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m opsloop.lab.origin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="origin")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--capacity", type=float, default=0, help="requests/s served; above → 503 (0 = unlimited)")
    p.add_argument("--latency-ms", type=float, default=0)
    p.add_argument("--health-file", type=Path)
    a = p.parse_args(argv)
    stats = {"ok": 0, "rejected": 0, "client_resets": 0}
    lock = threading.Lock()
    handler = make_handler(a.name, TokenBucket(a.capacity), a.latency_ms / 1000, a.health_file, stats, lock)
    server = OriginServer((a.bind, a.port), handler, stats, lock)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
