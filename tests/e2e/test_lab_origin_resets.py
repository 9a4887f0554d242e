"""The lab origins (`make run`'s near/far) stay quiet when a client resets its connection: HAProxy closes its
health checks with a reset, and each one was a 20-line ConnectionResetError traceback in the origin's log
(about one a second per origin, MBs an hour). Now counted at ``GET /stats`` (``client_resets``), not logged;
requests are still served."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest
import requests

from opsloop.lab.edge import OriginSpec, origin_process
from opsloop.stack import free_port

pytestmark = pytest.mark.integration


def stats(port: int) -> dict[str, int]:
    return requests.get(f"http://127.0.0.1:{port}/stats", timeout=5).json()


def wait_for_resets(port: int, at_least: int, timeout_s: float = 60.0) -> dict[str, int]:
    s = stats(port)
    assert "client_resets" in s, f"origin :{port} does not count client resets: {s}"
    deadline = time.monotonic() + timeout_s
    while s["client_resets"] < at_least and time.monotonic() < deadline:
        time.sleep(0.1)   # polling a counter, not waiting for a guessed moment
        s = stats(port)
    assert s["client_resets"] >= at_least, s
    return s


def reset_after_one_request(port: int, path: str = "/health") -> bytes:
    """A keep-alive request, its reply read, then a reset (SO_LINGER 0), as HAProxy ends a health check."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = c.recv(4096)
            if not chunk:
                break
            reply += chunk
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return reply


def test_a_client_reset_is_counted_not_a_traceback(tmp_path: Path) -> None:
    spec = OriginSpec("near", free_port(), capacity=0)
    proc = origin_process(spec, tmp_path)
    proc.start()
    try:
        for _ in range(3):
            assert reset_after_one_request(spec.port).startswith(b"HTTP/1.1 200")
        s = wait_for_resets(spec.port, 3)
        assert requests.get(f"http://127.0.0.1:{spec.port}/", timeout=5).json() == {"origin": "near"}
        assert stats(spec.port)["ok"] == s["ok"] + 1
    finally:
        proc.stop()
    log = proc.logfile.read_text(errors="replace")
    assert "Traceback" not in log and "ConnectionResetError" not in log, log[-3000:]


def test_haproxy_health_checks_leave_the_origin_logs_quiet(lab_edge) -> None:  # noqa: ANN001 - conftest fixture
    edge = lab_edge.start()
    for o in edge.origins:
        wait_for_resets(o.port, 2)   # HAProxy's checks (every 500 ms) have reset connections to both
    assert requests.get(edge.url, timeout=5).status_code == 200
    edge.stop()
    for o in edge.origins:
        log = (edge.workdir / f"origin-{o.name}.log").read_text(errors="replace")
        assert "Traceback" not in log, log[-3000:]
