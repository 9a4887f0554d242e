"""A request the edge API cuts off while its headers trickle in is said: counted and logged (sampled).

Before (old code): the whole-request deadline cut such a client off (its slot freed), but the timeout was caught
inside ``http.server`` and handed to the silenced ``log_message``: no line, no metric. A host holding the API's
slots with trickling clients, or a client on a bad link, left no trace. A cut body was logged, every time, and
counted nowhere.
Now: ``opsloop_edge_api_requests_cut_total{reason="headers"|"body"}`` counts each; ``api_headers_timeout`` /
``api_body_timeout`` are logged one line a minute each (the counter carries the rate). An idle kept-alive
connection closed after ``timeout_s`` (no byte of a request) is neither.
"""

from __future__ import annotations

import socket
from typing import Iterator

import pytest
from prometheus_client import REGISTRY

from opsloop.audit.trail import AuditLog
from opsloop.controllers.edge.service.api import EdgeApi
from opsloop.controllers.edge.service.store import TopologyStore
from tests.controllers.edge.service.test_api_slow_client import ok, trickle_until_closed
from tests.controllers.edge.service.test_safety import TOKEN, topology
from tests.helpers import captured_logs, wait_until

TIMEOUT_S = 1.0


def cut(reason: str) -> float:
    return REGISTRY.get_sample_value("opsloop_edge_api_requests_cut_total", {"reason": reason}) or 0.0


@pytest.fixture
def api() -> Iterator[EdgeApi]:
    a = EdgeApi(TopologyStore(topology(), AuditLog()), TOKEN, lambda: {}, lambda listener: [])
    a.serve("127.0.0.1", 0, timeout_s=TIMEOUT_S, max_connections=2)
    yield a
    a.stop()


def test_headers_cut_while_trickling_are_counted_and_logged_once_a_minute(api: EdgeApi) -> None:
    before, body_before = cut("headers"), cut("body")
    with captured_logs() as logs:
        for _ in range(3):
            closed, sent = trickle_until_closed(api.port, b"GET /v1/topology?secret=x HTTP/1.1\r\n", b"X")
            assert closed and b"200" not in sent
        wait_until(lambda: cut("headers") == before + 3, timeout=30, what="three cuts counted")
    lines = [line for line in logs.lines if line.startswith("api_headers_timeout ")]
    assert len(lines) == 1, logs.lines   # sampled: the counter carries the rate
    assert "'path': '/v1/topology'" in lines[0] and "'method': 'GET'" in lines[0] and "secret" not in lines[0]
    assert cut("body") == body_before
    assert ok(api.port)


def test_a_trickled_request_line_is_counted_too(api: EdgeApi) -> None:
    before = cut("headers")
    with captured_logs() as logs:
        closed, _ = trickle_until_closed(api.port, b"GE", b"T")
        assert closed
        wait_until(lambda: cut("headers") == before + 1, timeout=30, what="the cut counted")
    assert any(line.startswith("api_headers_timeout ") for line in logs.lines), logs.lines


def test_an_idle_connection_closed_is_no_cut_request(api: EdgeApi) -> None:
    before = cut("headers")
    with captured_logs() as logs:
        with socket.create_connection(("127.0.0.1", api.port), timeout=30) as s:
            assert s.recv(1024) == b""   # the server closes it after timeout_s: no byte was sent
        assert ok(api.port)              # served after the close: the idle one was handled whole
    assert cut("headers") == before
    assert not [line for line in logs.lines if "timeout" in line.split(" ", 1)[0]], logs.lines
