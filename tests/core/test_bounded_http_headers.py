"""``opsloop.bounded_http``: the status line and headers within ``total_s`` too, not per read only.

A server (or proxy) that sends its status line or headers one byte at a time, each byte well inside the
per-read timeout, held the caller (the paging loop's post, a Keystone probe round) until the whole head was
in: about an hour for a 64 KiB head at a byte every few seconds. Against a real loopback socket server that
counts the bytes it got out before the client went away.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import requests

from opsloop import bounded_http
from tests.trickle import ends_within

BODY = b'{"status":"success"}'
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + b"".join(b"X-Padding-%d: %s\r\n" % (i, b"p" * 40) for i in range(12))
        + b"Content-Length: %d\r\n\r\n" % len(BODY))
PACE_S = 0.02      # a byte every 20 ms: far inside the 1 s per-read timeout below
TOTAL_S = 0.3      # the deadline: about 15 bytes of the head get out before it
READ_S = 1.0


@dataclass
class Server:
    port: int = 0
    trickle: bool = True                     # the head a byte at a time (else at once)
    sent: list[int] = field(default_factory=list)   # bytes of the reply sent to each client before it went
    connections: int = 0


@contextmanager
def head_trickler(skip: int = 0) -> Iterator[Server]:
    """A loopback HTTP server answering each request with ``HEAD`` + ``BODY``; while ``trickle`` is set, the
    reply goes one byte every ``PACE_S`` after its first ``skip`` bytes (0: from the status line's first)."""
    state = Server()
    stop = threading.Event()
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    state.port = int(srv.getsockname()[1])
    reply = HEAD + BODY

    def serve_one(conn: socket.socket) -> None:
        sent = 0
        with conn:
            try:
                while not stop.is_set():   # keep-alive: one reply per request on the connection
                    conn.settimeout(5.0)
                    if not conn.recv(65536):
                        return
                    sent = 0
                    if not state.trickle:
                        conn.sendall(reply)
                        continue
                    conn.sendall(reply[:skip])
                    sent = skip
                    for i in range(skip, len(reply)):
                        conn.sendall(reply[i:i + 1])
                        sent += 1
                        if stop.wait(PACE_S):
                            return
            except OSError:
                pass   # the client shut its end and closed: the next byte found no one
            finally:
                if state.trickle:
                    state.sent.append(sent)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            state.connections += 1
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield state
    finally:
        stop.set()
        t.join(timeout=10)
        srv.close()


def get(session: requests.Session | None, port: int) -> requests.Response:
    return bounded_http.request(session, "GET", f"http://127.0.0.1:{port}/stats", timeout_s=READ_S, total_s=TOTAL_S,
                                max_bytes=1 << 20)


def wait_gone(server: Server) -> list[int]:
    """The byte counts once the server saw the client go (its next send fails)."""
    def gone() -> list[int]:
        while not server.sent:
            threading.Event().wait(0.01)
        return server.sent
    return ends_within(gone, limit_s=30)


@pytest.mark.parametrize("skip,where", [(0, "status line"), (len(b"HTTP/1.1 200 OK\r\n"), "headers")])
@pytest.mark.parametrize("own_session", [False, True])
def test_a_head_sent_a_byte_at_a_time_ends_at_the_deadline(skip: int, where: str, own_session: bool) -> None:
    with head_trickler(skip) as server:
        session = requests.Session() if own_session else None
        try:
            with pytest.raises(requests.ReadTimeout, match=rf"not complete within {TOTAL_S:g} s"):
                ends_within(lambda: get(session, server.port))
        finally:
            if session is not None:
                session.close()
        sent = wait_gone(server)
    # the whole reply at this pace takes ~14 s; the call gave up ~TOTAL_S in (a few bytes more on a busy host)
    assert sent[0] < len(HEAD) // 3, f"{where}: {sent[0]} of {len(HEAD)} head bytes sent before the client went"


def test_a_session_stays_usable_and_keeps_its_connection_alive_after_a_deadline() -> None:
    """The session given is reused: after a trickled head ended at the deadline, the next replies on it come
    whole, both over one kept-alive connection (the socket shut at the deadline is never pooled)."""
    with head_trickler() as server:
        session = requests.Session()
        try:
            with pytest.raises(requests.ReadTimeout):
                ends_within(lambda: get(session, server.port))
            server.trickle = False
            for _ in range(2):
                r = ends_within(lambda: get(session, server.port))
                assert r.status_code == 200 and r.json() == {"status": "success"}
        finally:
            session.close()
        assert server.connections == 2   # the shut one, then one kept alive for both good replies


def test_a_head_cut_short_at_the_deadline_is_never_taken_for_a_reply() -> None:
    """http.client ends the headers at an EOF: the shutdown at the deadline would make a 200 of a half head
    (Alertmanager's post counted delivered). It raises instead, also when the status line is whole."""
    with head_trickler(skip=len(HEAD) - 3) as server:   # all but the blank line's last bytes at once
        with pytest.raises(requests.ReadTimeout):
            ends_within(lambda: bounded_http.request(None, "GET", f"http://127.0.0.1:{server.port}/", timeout_s=READ_S,
                                                     total_s=PACE_S / 2, max_bytes=1 << 20))
