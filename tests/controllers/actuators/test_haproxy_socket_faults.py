"""An HAProxy admin socket that misbehaves: accepts and never answers, answers garbage, or answers a
byte at a time without end (a wedged process). Every command must end with a HaproxyError naming the
socket: the actuator serves every listener of its edge from one loop, so one hung command would hold
all of them (and the request-rate collector's round)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest

from opsloop.lb.haproxy import HaproxyAPI, HaproxyError

Behaviour = Callable[[socket.socket, threading.Event], None]


def silent(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait()


def garbage(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"\x00\xffhello there\n")


def trickle(conn: socket.socket, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        conn.sendall(b"1")


@pytest.fixture
def admin_socket(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    path = tmp_path / "admin.sock"
    behaviour: Behaviour = request.param
    stop = threading.Event()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)
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
                    behaviour(conn, stop)
                except OSError:
                    pass     # the client gave up and closed

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield path
    finally:
        stop.set()
        t.join(timeout=10)
        srv.close()


def ends(call: Callable[[], object]) -> BaseException | None:
    """Run ``call`` in a thread; the exception it ended with (None if it returned). Fails if it never ends."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            out.append(None)
        except BaseException as e:  # noqa: BLE001
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=30)          # a deadline for a hang, not a timing assertion
    assert not t.is_alive(), "the command never ended"
    return out[0]


@pytest.mark.parametrize("admin_socket", [silent, garbage, trickle], indirect=True, ids=["silent", "garbage", "trickle"])
def test_every_command_ends_with_an_error_naming_the_socket(admin_socket: Path) -> None:
    api = HaproxyAPI(admin_socket, timeout_s=0.5)
    err = ends(lambda: api.get_weight("be_web", "near"))
    assert isinstance(err, HaproxyError), err
    assert str(admin_socket) in str(err) or "unexpected reply" in str(err)
