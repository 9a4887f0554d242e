"""Resolve a BMC password from its reference (a file or an environment variable).

The secret only ever travels to ipmitool through the child's environment (``-E`` reads
IPMI_PASSWORD); it is never put in argv, logs, errors or metric labels. Errors name the
reference, not the value.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from opsloop.collectors.ipmi.config import ResolvedHost

MAX_PASSWORD_BYTES = 20  # IPMI v2 passwords are at most 20 bytes
_MAX_FILE_BYTES = 4096  # the password and trailing newlines; read at most this much


class CredentialError(ValueError):
    """The password reference cannot be resolved. The message names the reference only."""


def resolve_password(host: ResolvedHost) -> str:
    if host.password_env is not None:
        value = os.environ.get(host.password_env)
        if value is None:
            raise CredentialError(f"environment variable {host.password_env} (password of {host.name}) is not set")
        return _checked(value, f"environment variable {host.password_env}")
    if host.password_file is not None:
        path = Path(host.password_file)
        raw = _read_password_file(path, host.name)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:  # was a bare "UnicodeDecodeError" tool error naming no file
            raise CredentialError(f"password file {path} of {host.name}: not UTF-8 text "
                                  f"(at byte offset {e.start})") from None
        return _checked(text.rstrip("\r\n"), f"password file {path}")
    return ""  # anonymous/null password: some lab BMCs


def _read_password_file(path: Path, host: str) -> bytes:
    """The file's bytes, bounded. Non-blocking open and a regular file only: a FIFO without a writer
    blocked open() for ever (the round, every BMC behind it, never ended) and /dev/zero was read until
    memory ran out. Mode checked on the descriptor that is read, not on the name."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise CredentialError(f"password file {path} of {host}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CredentialError(f"password file {path} of {host} is not a regular file")
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise CredentialError(f"password file {path} of {host} is readable by group/others: chmod 600 it")
        try:
            raw = os.read(fd, _MAX_FILE_BYTES + 1)
        except OSError as e:
            raise CredentialError(f"password file {path} of {host}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(raw) > _MAX_FILE_BYTES:
        raise CredentialError(f"password file {path} of {host}: larger than {_MAX_FILE_BYTES} bytes, "
                              "not a password file")
    return raw


def _checked(value: str, where: str) -> str:
    if len(value.encode()) > MAX_PASSWORD_BYTES:
        raise CredentialError(f"{where}: password longer than {MAX_PASSWORD_BYTES} bytes (IPMI limit)")
    if "\n" in value or "\0" in value:
        raise CredentialError(f"{where}: password contains a newline or NUL")
    return value


def scrub(text: str, secret: str) -> str:
    """Remove a secret from text that is about to be logged or returned in an error."""
    if secret and len(secret) >= 3:
        return text.replace(secret, "***")
    return text
