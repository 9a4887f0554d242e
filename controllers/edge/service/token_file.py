"""The edge API's token file: created private, read with checks (no metrics, no service: the configuration's
validation reads it too, and importing the service's gauges there exported them, unset, from every process
that validates a config — the actuator's /metrics showed a control loop stuck since 1970).

A token written with ``write_text`` and ``chmod``-ed afterwards is readable by everyone on the machine
for a moment (and forever when the chmod never runs); :func:`create_token_file` opens the file with
mode 0600 and ``O_EXCL``. The service refuses a token file that group or others may read or write
(:func:`read_token_file`, through :func:`opsloop.private_file.read_private_file`), naming the file and the
command that fixes it (the token itself is never printed).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from opsloop.config import ConfigError
from opsloop.private_file import OpenToOthers, PrivateFileError, read_private_file

MIN_TOKEN_CHARS = 16


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
