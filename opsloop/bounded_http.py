"""HTTP replies read whole within a deadline.

requests' ``timeout`` bounds each socket read, not the reply: a server (or a proxy) that sends a byte
now and then holds a request for as long as it likes, and with it the caller (a collector's round, the
paging loop). Here the whole call, status line and headers included, ends within ``total_s``: a timer shuts
the connection's socket down at the deadline (a read blocked on it returns at once) and the call raises
requests.ReadTimeout; the body is read one socket read at a time, each bounded by the timeout. Before, the
status line and headers were bounded per read only: one header byte every few seconds held the caller for
about an hour.

The socket is known through the session's adapter (:class:`TrackingAdapter`, mounted in place of requests'
default one of a session given here: the same pool settings, keep-alive kept). Not bounded by the deadline,
each read bounded by ``timeout_s`` as before: a TLS handshake, a session with an adapter of its own, a SOCKS
proxy.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import requests
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from urllib3.poolmanager import ProxyManager


class _Deadline:
    """The sockets one call uses: shut down when its deadline passes (``expire``), unless it is done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.expired = False
        self.done = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            if self.done:
                return
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)   # connected past the deadline: it ends now too

    def expire(self) -> None:
        with self._lock:
            if self.done:
                return   # read to its end meanwhile: its connection may be back in the pool, for the next call
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def finish(self) -> bool:
        """Mark the call done (the timer no longer touches its sockets); False when the deadline had passed."""
        with self._lock:
            self.done = True
            return not self.expired


def _shut(sock: socket.socket) -> None:
    try:
        # the plain socket's shutdown, also for a TLS one: ssl.SSLSocket.shutdown drops its TLS state, which a
        # read in the caller's thread still uses
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass   # closed meanwhile


_local = threading.local()   # .deadline: the _Deadline of the call running in this thread


def _track(sock: socket.socket | None) -> None:
    deadline: _Deadline | None = getattr(_local, "deadline", None)
    if deadline is not None and sock is not None:
        deadline.add(sock)


class _HTTPConnection(urllib3.connection.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _track(self.sock)

    def request(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        _track(self.sock)   # a kept-alive connection (None for a new one: connect() tracks it)
        super().request(*args, **kwargs)


class _HTTPSConnection(urllib3.connection.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _track(self.sock)

    def request(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        _track(self.sock)
        super().request(*args, **kwargs)


class _HTTPPool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS: dict[str, type[urllib3.connectionpool.HTTPConnectionPool]] = {"http": _HTTPPool, "https": _HTTPSPool}


class TrackingAdapter(HTTPAdapter):
    """requests' adapter whose connections tell :func:`request` their sockets (to shut them at its deadline)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, ProxyManager):   # an HTTP(S) proxy; a SOCKS one keeps its own pools
            manager.pool_classes_by_scheme = dict(_POOLS)
        return manager


def _tracked(session: requests.Session) -> None:
    """Put a TrackingAdapter in place of requests' default adapter of ``session`` (its settings kept)."""
    for prefix in ("https://", "http://"):
        old = session.adapters.get(prefix)
        if type(old) is HTTPAdapter:   # a subclass is the caller's own: left alone
            session.mount(prefix, TrackingAdapter(old._pool_connections, old._pool_maxsize, old.max_retries,
                                                  old._pool_block))
            old.close()


def request(session: requests.Session | None, method: str, url: str, *, timeout_s: float, total_s: float,
            max_bytes: int, **kwargs: Any) -> requests.Response:
    """``session.request`` (or a one-off request) complete, status line, headers and body, within ``total_s``.

    Raises requests.ReadTimeout past ``total_s``, requests.ConnectionError if the reply breaks off,
    requests.RequestException for a body over ``max_bytes``; the response's .content/.json() work."""
    own = session is None
    sess = requests.Session() if session is None else session
    _tracked(sess)
    deadline = _Deadline()
    timer = threading.Timer(total_s, deadline.expire)
    timer.daemon = True
    _local.deadline = deadline
    timer.start()
    try:
        return _request(sess, deadline, method, url, timeout_s=timeout_s, total_s=total_s, max_bytes=max_bytes,
                        **kwargs)
    finally:
        _local.deadline = None
        timer.cancel()
        if own:
            sess.close()


def _late(url: str, total_s: float) -> requests.ReadTimeout:
    return requests.ReadTimeout(f"reply from {url} not complete within {total_s:g} s")


def _request(session: requests.Session, deadline: _Deadline, method: str, url: str, *, timeout_s: float,
             total_s: float, max_bytes: int, **kwargs: Any) -> requests.Response:
    started = time.monotonic()
    try:
        resp = session.request(method, url, timeout=timeout_s, stream=True, **kwargs)
    except requests.RequestException:
        if deadline.expired:   # the error is the socket shut at the deadline
            raise _late(url, total_s) from None
        raise
    chunks: list[bytes] = []
    size = 0
    try:
        if deadline.expired:
            # headers cut short by the shutdown read as their end (http.client): never taken for a reply
            raise _late(url, total_s)
        while True:
            try:
                chunk = resp.raw.read1(65536)  # at most one socket read, bounded by timeout_s
            except urllib3.exceptions.ReadTimeoutError as e:
                raise requests.ReadTimeout(str(e)) from None
            except (urllib3.exceptions.ProtocolError, urllib3.exceptions.DecodeError, OSError) as e:
                if deadline.expired:
                    raise _late(url, total_s) from None
                raise requests.ConnectionError(str(e)) from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise requests.RequestException(f"reply from {url} is over {max_bytes} bytes")
            if resp.raw.length_remaining == 0:
                break  # its Content-Length is in: a reply complete just past the deadline is not late
            if time.monotonic() - started > total_s:
                raise _late(url, total_s)
        if not deadline.finish() and resp.raw.length_remaining != 0:
            raise _late(url, total_s)   # its end is the shutdown's, not the server's
    except BaseException:
        resp.close()  # the connection is in the middle of a reply: never back to the pool
        raise
    if deadline.expired:
        resp.close()   # complete, but its socket is shut: not for the next call
    else:
        resp.raw.release_conn()  # read to its end: the connection is kept alive for the next probe
    resp._content = b"".join(chunks)  # requests' own body cache: .content, .text and .json() read it
    resp._content_consumed = True
    return resp
