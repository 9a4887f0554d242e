"""The edge API's bearer token: its file created private, read with checks, and re-read when it changes.

A token written with ``write_text`` and ``chmod``-ed afterwards is readable by everyone on the machine
for a moment (and forever when the chmod never runs); :func:`create_token_file` opens the file with
mode 0600 and ``O_EXCL``. The service refuses a token file that group or others may read or write
(:func:`read_token_file`, through :func:`opsloop.private_file.read_private_file`), naming the file and the
command that fixes it (the token itself is never printed).

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
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Callable

from opsloop.config import ConfigError
from opsloop.controllers.edge.service import metrics as M
from opsloop.log import get_logger
from opsloop.private_file import OpenToOthers, PrivateFileError, read_private_file

log = get_logger("controller.edge.api")
MIN_TOKEN_CHARS = 16
CHECK_EVERY_S = 1.0


class TokenFileError(ConfigError):
    """The token file gives no usable token. ``lasting``: a misconfiguration of the file itself (open to
    others, not a regular file, not UTF-8, too large) rather than a state a rewrite passes through
    (missing, unreadable, empty, short)."""

    def __init__(self, message: str, lasting: bool) -> None:
        super().__init__(message)
        self.lasting = lasting


def create_token_file(path: Path, token: str | None = None) -> str:
    """Write ``token`` (default: a new random one) to a new file ``path`` with mode 0600; return it.
    An existing file is never overwritten (FileExistsError)."""
    token = token or secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_token_file(path: Path) -> str:
    """The token in ``path`` (stripped); :class:`TokenFileError` naming the file and what is wrong (never
    the token or its bytes)."""
    where = f"controllers.edge.api.token_file {path}"
    try:   # group or others may not read it; a FIFO or device is never waited on
        token = read_private_file(path).decode("utf-8").strip()
    except OSError as e:
        raise TokenFileError(f"{where}: {e.strerror}", lasting=False) from None
    except OpenToOthers as e:
        raise TokenFileError(f"{where}: mode {e.mode:04o} lets group or others read it; "
                             f"run `chmod 600 {path}`", lasting=True) from None
    except PrivateFileError as e:
        raise TokenFileError(f"{where}: {e}", lasting=True) from None
    except UnicodeDecodeError as e:   # the byte is not shown (a secret)
        raise TokenFileError(f"{where}: not UTF-8 text (at byte offset {e.start})", lasting=True) from None
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenFileError(f"controllers.edge.api: the bearer token from token_file {path} is missing or "
                             f"shorter than {MIN_TOKEN_CHARS} characters", lasting=False)
    return token


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


_Stamp = tuple[int, int, int, int, int] | str   # (dev, ino, size, mtime_ns, ctime_ns), or the stat error


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
        self._stamp: _Stamp | None = None
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

    def _stat(self) -> _Stamp:
        try:
            st = os.stat(self.path)
        except OSError as e:
            return f"stat: {e.strerror}"
        # ctime too: a chmod changes neither size nor mtime
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _check(self, now: float) -> None:
        """Under the lock: re-read the file when its stamp changed (taken before the read: a write after it
        changes the stamp again and is read at the next check)."""
        self._checked_at = now
        stamp = self._stat()
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
