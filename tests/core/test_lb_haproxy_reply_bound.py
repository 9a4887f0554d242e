"""The runtime-API reply is bounded in bytes, not only in time: an admin socket path that points at something
streaming (a misconfigured socket, a relay in a loop) is refused past the bound, with an error naming the
socket and the bound. Before, the reply grew in memory until the deadline (5 x timeout_s), or was returned
whole however large when the stream ended before it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from opsloop.lb.haproxy import HaproxyAPI, HaproxyError
from tests.helpers import wait_until

CHUNK = b"x" * 65536
DEFAULT_BOUND = 64 * 1024 * 1024


@dataclass
class Streamer:
    """A unix socket that answers every command with ``total`` bytes (None: without end) and closes."""

    path: Path
    total: int | None = None
    sent: int = 0
    ended: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def streamer(tmp_path: Path) -> Iterator[Streamer]:
    st = Streamer(tmp_path / "admin.sock")
    stop = threading.Event()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(st.path))
    srv.listen(4)
    srv.settimeout(0.2)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            with conn:
                conn.recv(1024)
                try:
                    while not stop.is_set() and (st.total is None or st.sent < st.total):
                        n = len(CHUNK) if st.total is None else min(len(CHUNK), st.total - st.sent)
                        conn.sendall(CHUNK[:n])
                        st.sent += n
                except OSError:
                    pass   # the reader refused the rest and closed
                st.ended.set()

    t = threading.Thread(target=serve, name="streamer", daemon=True)
    t.start()
    try:
        yield st
    finally:
        stop.set()
        t.join(timeout=10)
        srv.close()


def test_a_reply_past_the_default_bound_is_refused_naming_socket_and_bound(streamer: Streamer) -> None:
    streamer.total = DEFAULT_BOUND + 2 * len(CHUNK)   # ends well before the deadline: before, returned whole
    with pytest.raises(HaproxyError) as e:
        HaproxyAPI(streamer.path, timeout_s=10).show_stat()
    msg = str(e.value)
    assert str(streamer.path) in msg and f"larger than {DEFAULT_BOUND} bytes" in msg, msg


def test_an_endless_stream_is_cut_at_the_bound(streamer: Streamer) -> None:
    api = HaproxyAPI(streamer.path, timeout_s=10, max_reply_bytes=1024 * 1024)
    with pytest.raises(HaproxyError, match=r"'show stat' reply larger than 1048576 bytes, refused"):
        api.show_stat()
    wait_until(streamer.ended.is_set, timeout=30, what="the streamer to see the reader close")
    # read no further than the bound, plus what the socket buffers held when the reader closed
    assert streamer.sent < 8 * 1024 * 1024, streamer.sent


def test_a_reply_within_the_bound_is_read_whole(streamer: Streamer) -> None:
    streamer.total = 1024 * 1024
    assert HaproxyAPI(streamer.path, timeout_s=10, max_reply_bytes=1024 * 1024).command("show info") == \
        "x" * (1024 * 1024)
