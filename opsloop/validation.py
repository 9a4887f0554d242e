"""Pydantic validation errors as lines an operator can act on: one error per line, with its full path.

``controllers.edge.interval_s: Input should be a valid number (got 'banana')`` — the path from the top of
the file (or record), the reason, and the offending value cut to a readable length (never the whole dict
it sits in).
"""

from __future__ import annotations

from pydantic import ValidationError

from opsloop.redact import redact_credentials

MAX_SHOWN = 80


def shown(value: object) -> str:
    """``repr`` of an offending value, cut to :data:`MAX_SHOWN` characters."""
    text = redact_credentials(repr(value))   # a URL's user:password@ never reaches the output
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def error_lines(e: ValidationError, prefix: str = "") -> list[str]:
    """One ``path: reason (got value)`` line per error; ``prefix`` is the section's path (``"a.b."``)."""
    lines = []
    for err in e.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()))
        where = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "(top level)")
        # A validator's own message may quote the value: no user:password@ of a URL in it either.
        msg = redact_credentials(str(err.get("msg", "invalid")).removeprefix("Value error, "))
        if err.get("type") == "extra_forbidden":
            lines.append(f"{where}: unknown setting")
        elif err.get("type") == "missing":
            lines.append(f"{where}: required setting missing")
        elif isinstance(err.get("input"), dict) and err.get("type", "").startswith("value_error"):
            lines.append(f"{where}: {msg}")   # a model-level check: its message names the fields
        else:
            lines.append(f"{where}: {msg} (got {shown(err.get('input'))})")
    return lines
