"""A TCP server that answers with a head, then one byte every 50 ms until the client goes: a wedged HTTP
server or proxy (Keystone, uWSGI's stats, Alertmanager). Each read of a client gets a byte in time, so
only a bound on the whole reply ends the request."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

HTTP_200 = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"


@contextmanager
def trickle_server(head: bytes = HTTP_200) -> Iterator[int]:
    """Yield the port of a loopback server that sends ``head`` then a byte every 50 ms to each client."""
    stop = threading.Event()
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)

    def serve_one(conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(0.2)
                try:
                    conn.recv(65536)   # the request, if the client sends one
                except socket.timeout:
                    pass
                conn.sendall(head)
                while not stop.wait(0.05):
                    conn.sendall(b" ")
            except OSError:
                pass                   # the client gave up and closed

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield int(srv.getsockname()[1])
    finally:
        stop.set()
        t.join(timeout=10)
        srv.close()


def ends_within(call, limit_s: float = 60.0):  # type: ignore[no-untyped-def]
    """``call()``'s result, run in a thread; fails if it never ends (a deadline for a hang, not a timing
    assertion). Its exception is re-raised."""
    out: list[object] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as e:  # noqa: BLE001
            err.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=limit_s)
    assert not t.is_alive(), "the call never ended"
    if err:
        raise err[0]
    return out[0]
