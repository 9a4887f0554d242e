"""Credentials out of log lines: ``scheme://user:password@host`` becomes ``scheme://***@host``.

Alertmanager and Elasticsearch URLs may carry basic-auth credentials (``https://ops:s3cret@am:9093``).
They appear in configuration dumps, connection errors and library messages, so the JSON log formatter
(:mod:`opsloop.log`) passes every line through :func:`redact_credentials`; code that shows a URL
elsewhere (a CLI's output, an error message) uses :func:`redact_url`.
"""

from __future__ import annotations

import re

# The userinfo runs to the *last* "@" before the host: a password may itself contain "@".
# It never contains "/", whitespace or quotes, so the match cannot run across a JSON string's end.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+._\-]*://)(?P<userinfo>[^/\s\"'<>?#\\]+)@")
MASK = "***"
# a field or setting whose name holds one of these carries a secret: its value is never shown (logs, config check,
# validation errors)
SECRET_MARKERS = ("password", "secret", "token", "passwd", "credential", "authorization", "api_key")


def names_a_secret(name: str) -> bool:
    lowered = name.lower()
    return any(m in lowered for m in SECRET_MARKERS)


def redact_credentials(text: str) -> str:
    """Every ``scheme://userinfo@`` in ``text`` with the userinfo masked."""
    if "@" not in text:   # the common case costs one scan
        return text
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


def redact_url(url: str) -> str:
    """One URL with its user and password masked (``https://***@am.example:9093/``)."""
    return redact_credentials(url)
