"""A unix socket that answers the runtime API like HAProxy whose connection closed mid-answer.

It relays each command to the real admin socket (or answers a recorded reply) and sends the reply cut by
``cut`` before closing: what a reload, a dying HAProxy or a proxy in between leaves the reader with.
"""

from __future__ import annotations

import shutil
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path


def whole(reply: str) -> str:
    return reply


def after_row(svname: str) -> Callable[[str], str]:
    """The reply up to and with the row of ``svname`` (its "\\n" included): torn exactly at a row boundary."""
    def cut(reply: str) -> str:
        lines = reply.split("\n")
        i = next(i for i, line in enumerate(lines) if line.split(",")[1:2] == [svname])
        return "\n".join(lines[:i + 1]) + "\n"
    return cut


def after_header(reply: str) -> str:
    return reply.split("\n", 1)[0] + "\n"


class CutReply:
    def __init__(self, upstream: Path | None = None, recorded: str | None = None) -> None:
        assert (upstream is None) != (recorded is None)
        self.upstream = upstream
        self.recorded = recorded
        self.cut: Callable[[str], str] = whole
        self._dir = Path(tempfile.mkdtemp(prefix="opsl-cut-"))   # short: a unix socket path takes 107 bytes
        self.path = self._dir / "admin.sock"
        relay = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                cmd = self.rfile.readline()
                self.wfile.write(relay.cut(relay._reply(cmd)).encode())

        self._server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="cut-reply", daemon=True)

    def _reply(self, cmd: bytes) -> str:
        if self.recorded is not None:
            return self.recorded
        assert self.upstream is not None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.upstream))
            s.sendall(cmd)
            chunks = []
            while b := s.recv(65536):
                chunks.append(b)
        return b"".join(chunks).decode()

    def __enter__(self) -> "CutReply":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)
