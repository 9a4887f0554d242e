"""The edge API's bearer-token file: created private (0600 from the first byte), refused when it is not.

A token written with ``write_text`` and ``chmod``-ed afterwards is readable by everyone on the machine
for a moment (and forever when the chmod never runs); :func:`create_token_file` opens the file with
mode 0600 and ``O_EXCL``. The service refuses a token file that group or others may read or write
(``config.read_token``, through :func:`opsloop.private_file.read_private_file`), naming the file and the
command that fixes it (the token itself is never printed).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def create_token_file(path: Path, token: str | None = None) -> str:
    """Write ``token`` (default: a new random one) to a new file ``path`` with mode 0600; return it.
    An existing file is never overwritten (FileExistsError)."""
    token = token or secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
