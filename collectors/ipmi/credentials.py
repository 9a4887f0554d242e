"""Resolve a BMC password from its reference (a file or an environment variable).

The secret only ever travels to ipmitool through the child's environment (``-E`` reads
IPMI_PASSWORD); it is never put in argv, logs, errors or metric labels. Errors name the
reference, not the value.
"""

from __future__ import annotations

import os
from pathlib import Path

from opsloop.private_file import NotRegularFile, OpenToOthers, TooLarge, read_private_file
from opsloop.collectors.ipmi.config import ResolvedHost

MAX_PASSWORD_BYTES = 20  # IPMI v2 passwords are at most 20 bytes
# Shorter (non-empty) passwords are refused: masking one by substring would mangle every message and, by
# where the masks land, give it away ("F***iled" for "a"); IPMI 2.0's RAKP hands any caller an HMAC of the
# password to crack offline, so a 1-2 character one protects the BMC no better than none.
MIN_PASSWORD_CHARS = 3


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
    """The file's bytes (:func:`opsloop.private_file.read_private_file`: a FIFO or device is never waited on)."""
    try:
        return read_private_file(path)
    except OSError as e:
        raise CredentialError(f"password file {path} of {host}: {e.strerror}") from None
    except NotRegularFile:
        raise CredentialError(f"password file {path} of {host} is not a regular file") from None
    except OpenToOthers:
        raise CredentialError(f"password file {path} of {host} is readable by group/others: chmod 600 it") from None
    except TooLarge as e:
        raise CredentialError(f"password file {path} of {host}: larger than {e.limit} bytes, "
                              "not a password file") from None


def _checked(value: str, where: str) -> str:
    if len(value.encode()) > MAX_PASSWORD_BYTES:
        raise CredentialError(f"{where}: password longer than {MAX_PASSWORD_BYTES} bytes (IPMI limit)")
    if "\n" in value or "\0" in value:
        raise CredentialError(f"{where}: password contains a newline or NUL")
    if 0 < len(value) < MIN_PASSWORD_CHARS:
        raise CredentialError(f"{where}: password shorter than {MIN_PASSWORD_CHARS} characters: it cannot be kept "
                              "out of logged ipmitool output; set a longer BMC password (or none, for an "
                              "anonymous BMC)")
    return value


def scrub(text: str, secret: str) -> str:
    """Remove a secret from text that is about to be logged or returned in an error
    (:func:`resolve_password` never returns a shorter one than this masks)."""
    if len(secret) >= MIN_PASSWORD_CHARS:
        return text.replace(secret, "***")
    return text
