"""Keystone, or the uWSGI stats server, that answers a byte now and then without end (a wedged worker,
a proxy draining a huge reply). Each read is bounded by the timeout, the reply was not: the round never
ended, so the collector published nothing, for Keystone and every log it tails."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from opsloop.collect.types import Round
from opsloop.collectors.keystone import Config, build

HEAD_201 = (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nX-Subject-Token: tok\r\n"
            b"Content-Length: 100000000\r\n\r\n")
HEAD_200 = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"


@pytest.fixture
def trickler() -> Iterator[Callable[[bytes], int]]:
    """Start a TCP server that sends ``head`` then one byte every 50 ms until the client goes."""
    stop = threading.Event()
    servers: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def start(head: bytes) -> int:
        srv = socket.create_server(("127.0.0.1", 0))
        srv.settimeout(0.2)
        servers.append(srv)

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except OSError:
                    continue
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
                        pass               # the client gave up and closed

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        threads.append(t)
        return int(srv.getsockname()[1])

    yield start
    stop.set()
    for t in threads:
        t.join(timeout=10)
    for s in servers:
        s.close()


def collect_ends(cfg: Config) -> Round:
    """One round in a thread; fails if it never ends (a deadline for a hang, not a timing assertion)."""
    out: list[Round] = []
    collector = build(cfg)
    t = threading.Thread(target=lambda: out.append(collector.collect()), daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the round never ended"
    return out[0]


@pytest.fixture
def probe_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSLOOP_KEYSTONE_USERNAME", "probe")
    monkeypatch.setenv("OPSLOOP_KEYSTONE_PASSWORD", "pw-never-shown")
    monkeypatch.setenv("OPSLOOP_KEYSTONE_PROJECT", "service")


def test_a_trickling_keystone_ends_the_probe_with_a_timeout(trickler: Callable[[bytes], int],
                                                            probe_credentials: None) -> None:
    port = trickler(HEAD_201)
    r = collect_ends(Config(url=f"http://127.0.0.1:{port}", probes={"timeout_s": 0.5, "samples": 2}))
    [err] = r.errors
    assert err.kind == "timeout" and err.target == f"http://127.0.0.1:{port}/v3/auth/tokens", err
    assert "pw-never-shown" not in err.message


@pytest.mark.parametrize("scheme", ["tcp", "http"])
def test_a_trickling_uwsgi_stats_server_is_a_timeout_and_the_rest_is_kept(
        trickler: Callable[[bytes], int], scheme: str, tmp_path) -> None:
    port = trickler(HEAD_200 if scheme == "http" else b"{")
    address = f"http://127.0.0.1:{port}" if scheme == "http" else f"127.0.0.1:{port}"
    log = tmp_path / "access.log"
    log.write_text("uwsgi_req ts_ms=1795315485635 method=GET uri=/v3/x status=200 msecs=3 rsize=1 pid=1\n")
    r = collect_ends(Config(probes={"enabled": False}, uwsgi_stats=address, uwsgi_access_log=str(log),
                            start_at="start", round_timeout_s=2))
    [err] = r.errors
    assert err.kind == "timeout" and err.target == address and "uWSGI stats" in err.message, err
    assert [m.fields["parsed"] for m in r.metrics if m.name == "keystone_logfile"] == [1.0]  # the log still read
