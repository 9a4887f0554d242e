"""A paced HTTP traffic generator: a known request rate, so tests can check measured rates against it.

    python -m opsloop.lab.traffic --url http://127.0.0.1:28080/ --rate 20 --duration 60
"""

from __future__ import annotations

import argparse
import http.client
import sys
import threading
import time
from collections import Counter
from urllib.parse import urlsplit


class TrafficGenerator:
    """Sends ``rate`` requests/s (open loop: a schedule, not a feedback loop) from ``workers`` threads."""

    def __init__(self, url: str, rate: float, workers: int = 8, timeout_s: float = 5.0) -> None:
        u = urlsplit(url)
        self.host, self.port, self.path = u.hostname or "127.0.0.1", u.port or 80, u.path or "/"
        self.rate = rate
        self.workers = workers
        self.timeout_s = timeout_s
        self.codes: Counter[int] = Counter()
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._t0 = 0.0
        self._next = 0

    def set_rate(self, rate: float) -> None:
        with self._lock:
            # Re-anchor the schedule so a rate change applies from now on.
            self._t0 = time.monotonic()
            self._next = 0
            self.rate = rate

    def _slot(self) -> float | None:
        with self._lock:
            if self.rate <= 0:
                return time.monotonic() + 0.1
            at = self._t0 + self._next / self.rate
            self._next += 1
            return at

    def _run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        while not self._stop.is_set():
            at = self._slot()
            if at is None:
                return
            delay = at - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            if self.rate <= 0:
                continue
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
                conn.request("GET", self.path)
                resp = conn.getresponse()
                resp.read()
                code = resp.status
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                code = 0
                if conn is not None:
                    conn.close()
                conn = None
            with self._lock:
                self.codes[code] += 1
                self.sent += 1

    def start(self) -> "TrafficGenerator":
        self._t0 = time.monotonic()
        self._threads = [threading.Thread(target=self._run, daemon=True, name=f"traffic-{i}")
                         for i in range(self.workers)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout_s + 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m opsloop.lab.traffic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--rate", type=float, default=20)
    p.add_argument("--duration", type=float, default=0, help="seconds (0 = until interrupted)")
    p.add_argument("--workers", type=int, default=8)
    a = p.parse_args(argv)
    gen = TrafficGenerator(a.url, a.rate, a.workers).start()
    try:
        if a.duration:
            time.sleep(a.duration)
        else:
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        gen.stop()
    print(dict(gen.codes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
