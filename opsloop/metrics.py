"""Prometheus exposition for opsloop services: every service serves ``/metrics`` on loopback."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import MetricsHandler

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
