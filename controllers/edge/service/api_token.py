"""The edge API's bearer token: its file created private, read with checks, and re-read when it changes.

The file itself (created private, read with checks) is :mod:`token_file`'s, re-exported here.

The token was read once at start: a rotated token needed a restart, and a restart while the file was
empty (a rewrite in progress, a secret not yet mounted) exited 78 and kept the control loop down with
the API. :class:`TokenFile` looks at the file (stat: inode, size, mtime, ctime) at most once per
``check_every_s`` and re-reads it when it changed: the new token is taken at once, the old refused.
While the file gives no usable token (empty, short, missing, unreadable, open to others) every request
that needs one is refused (503), said once per change (``api_token_unusable``) and in
``opsloop_edge_api_token_usable`` 0; the control loop does not depend on it.
"""

from __future__ import annotations

import hmac
import threading
import time
from pathlib import Path
from typing import Callable

from opsloop.controllers.edge.service import metrics as M
from opsloop.controllers.edge.service.token_file import (MIN_TOKEN_CHARS, TokenFileError, create_token_file,
                                                         read_token_file)
from opsloop.file_stamp import FileStamp, file_stamp
from opsloop.log import get_logger

__all__ = ["MIN_TOKEN_CHARS", "ApiToken", "StaticToken", "TokenFile", "TokenFileError", "create_token_file",
           "read_token_file"]

log = get_logger("controller.edge.api")
CHECK_EVERY_S = 1.0


class ApiToken:
    """What the API checks a bearer token against. ``current()``: the token's bytes, or None while there is
    no usable one (every request needing it is refused); ``problem``: why not, for the log (no secret)."""

    problem = ""

    def current(self) -> bytes | None:
        raise NotImplementedError

    def matches(self, presented: str) -> bool | None:
        """True/False for ``presented`` against the token (constant time); None: no usable token."""
        token = self.current()
        if token is None:
            return None
        return hmac.compare_digest(presented.encode(), token)


class StaticToken(ApiToken):
    """A token given once (the environment variable, tests)."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("edge API: empty bearer token")
        self._token = token.encode()
        M.API_TOKEN_USABLE.set(1)

    def current(self) -> bytes | None:
        return self._token




class TokenFile(ApiToken):
    """The token in ``path``, re-read when the file changes (module docstring). Thread-safe: the API's
    handler threads call :meth:`current` at once."""

    def __init__(self, path: Path, check_every_s: float = CHECK_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.check_every_s = check_every_s
        self.clock = clock
        self._lock = threading.Lock()
        self._token: bytes | None = None
        self._stamp: FileStamp | None = None
        self._checked_at = float("-inf")
        self.problem = ""
        self._lasting = False   # the problem is a misconfiguration of the file (TokenFileError.lasting)
        self.loads = 0   # tokens taken from the file (the first one and each rotation)
        with self._lock:
            self._check(clock())

    def current(self) -> bytes | None:
        now = self.clock()
        with self._lock:
            if now - self._checked_at >= self.check_every_s:
                self._check(now)
            return self._token

    def _check(self, now: float) -> None:
        """Under the lock: re-read the file when its stamp changed (taken before the read: a write after it
        changes the stamp again and is read at the next check)."""
        self._checked_at = now
        stamp = file_stamp(self.path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            token = read_token_file(self.path).encode()
        except TokenFileError as e:
            if self._token is not None or str(e) != self.problem:   # once per change, not per check
                log.error("api_token_unusable", error=str(e),
                          consequence="every API request needing the token is refused (503) until the file "
                                      "is fixed; the control loop runs on")
            self._token, self.problem, self._lasting = None, str(e), e.lasting
            M.API_TOKEN_USABLE.set(0)
            return
        if token != self._token:
            if self._token is not None:
                log.info("api_token_rotated", file=str(self.path), consequence="the old token is refused")
            elif self.loads or self.problem:
                log.info("api_token_restored", file=str(self.path), was=self.problem)
            self.loads += 1
        self._token, self.problem, self._lasting = token, "", False
        M.API_TOKEN_USABLE.set(1)

    def raise_if_lasting(self) -> None:
        """At start: a file misconfigured for good (open to others, not a regular file, not UTF-8) stops the
        service (exit 78) rather than leaving the API refusing; a missing, empty or short file does not."""
        with self._lock:
            if self._token is None and self._lasting:
                raise TokenFileError(self.problem, lasting=True)
