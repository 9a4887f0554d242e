"""Prometheus exposition for opsloop services: every service serves ``/metrics`` on loopback."""

from __future__ import annotations

import signal
import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import MetricsHandler

from opsloop.log import get_logger

DEFAULT_BIND = "127.0.0.1"


def serve_metrics(port: int, bind: str = DEFAULT_BIND, registry: CollectorRegistry = REGISTRY) -> ThreadingHTTPServer:
    """Serve ``registry`` on http://bind:port/metrics from a daemon thread; returns the server.

    Port 0 picks a free port (read it back from ``server.server_address``). A taken port raises
    OSError with the port in the message, so the caller can say which one.
    """
    handler: Any = MetricsHandler.factory(registry)
    try:
        server = ThreadingHTTPServer((bind, port), handler)
    except OSError as e:
        raise OSError(e.errno, f"cannot serve /metrics on {bind}:{port}: {e.strerror}") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=f"metrics:{port}", daemon=True).start()
    return server


def serve_service_metrics(prog: str, port: int, bind: str, setting: str) -> ThreadingHTTPServer | None:
    """Start a service's /metrics; on a taken port print one line naming it and the setting to change."""
    try:
        server = serve_metrics(port, bind)
    except OSError as e:
        print(f"{prog}: {e}; set {setting}", file=sys.stderr)
        return None
    get_logger("metrics").info("metrics_serving", address=f"{server.server_address[0]}:{server.server_address[1]}")
    return server


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM: long-running services poll it to stop cleanly."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
