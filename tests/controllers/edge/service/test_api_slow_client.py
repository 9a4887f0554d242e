"""The edge API against a client that sends its request a byte at a time (real server, real sockets).

Before (old code): ``timeout_s`` was only the socket timeout, which bounds each read: a client sending one byte
of its headers (or of its body) every fraction of ``timeout_s`` kept its connection, and its one of the
``max_connections`` slots, for as long as it liked. The token is checked once the headers are in, so
``max_connections`` such clients, no token needed, answered every operator's drain with 503.
Now: a request (line, headers, body) must arrive whole within ``timeout_s`` of when it is awaited.
"""

from __future__ import annotations

import logging
import select
import socket
from typing import Iterator

import pytest
import requests

from opsloop.audit.trail import AuditLog
from opsloop.controllers.edge.service.api import EdgeApi
from opsloop.controllers.edge.service.store import TopologyStore
from tests.controllers.edge.service.test_safety import TOKEN, topology
from tests.helpers import wait_until

TIMEOUT_S = 1.0
TRICKLE_S = TIMEOUT_S / 5   # each read gets a byte well within the socket timeout
BYTES = 100                 # 20 s of trickle: 20 times the request's allowance


@pytest.fixture
def api() -> Iterator[EdgeApi]:
    a = EdgeApi(TopologyStore(topology(), AuditLog()), TOKEN, lambda: {}, lambda listener: [])
    a.serve("127.0.0.1", 0, timeout_s=TIMEOUT_S, max_connections=1)
    yield a
    a.stop()


def trickle_until_closed(port: int, head: bytes, byte: bytes) -> tuple[bool, bytes]:
    """Send ``head``, then ``byte`` every TRICKLE_S (paced by waiting for the server's reply or close);
    (closed by the server within BYTES bytes, what it sent)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    got = b""
    try:
        s.sendall(head)
        for _ in range(BYTES):
            try:
                s.sendall(byte)
            except OSError:
                return True, got
            readable, _, _ = select.select([s], [], [], TRICKLE_S)
            if readable:
                try:
                    chunk = s.recv(65536)
                except OSError:
                    return True, got
                if not chunk:
                    return True, got
                got += chunk
        return False, got
    finally:
        s.close()


def ok(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/v1/topology", headers={"Authorization": f"Bearer {TOKEN}"},
                            timeout=10).status_code == 200
    except requests.RequestException:
        return False


def test_headers_sent_a_byte_at_a_time_are_cut_off_and_free_the_slot(api: EdgeApi) -> None:
    closed, sent = trickle_until_closed(api.port, b"GET /v1/topology HTTP/1.1\r\n", b"X")
    assert closed, f"a header trickled for {BYTES * TRICKLE_S:g} s kept its connection (timeout_s {TIMEOUT_S:g})"
    assert b"200" not in sent
    wait_until(lambda: ok(api.port), timeout=30, what="the only slot free again")


def test_a_body_sent_a_byte_at_a_time_is_cut_off_and_said(api: EdgeApi, caplog) -> None:
    caplog.set_level(logging.INFO)
    head = (b"PUT /v1/listeners/web/origins/near/capacity HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {BYTES * 2}\r\n\r\n".encode())
    closed, sent = trickle_until_closed(api.port, head, b" ")
    assert closed and sent == b""
    wait_until(lambda: ok(api.port), timeout=30, what="the only slot free again")
    assert any(getattr(r, "event", "") == "api_body_timeout" for r in caplog.records)
    assert api.store.origin("web", "near")["capacity_rps"] == 40   # nothing applied from a cut body


def test_requests_on_one_kept_alive_connection_each_get_the_whole_allowance(api: EdgeApi) -> None:
    with requests.Session() as session:
        for _ in range(3):
            r = session.get(f"http://127.0.0.1:{api.port}/v1/topology", headers={"Authorization": f"Bearer {TOKEN}"},
                            timeout=10)
            assert r.status_code == 200
