"""HAProxy runtime API over its admin unix socket (``stats socket ... level admin``).

Used by the request-rate collector (``show stat``) and the weight actuator (``get weight`` /
``set weight``). HAProxy answers errors as text with success framing (socat would exit 0), so
every reply is checked against the known error texts and raised as :class:`HaproxyError`.
"""

from __future__ import annotations

import csv
import re
import io
import socket
import time
from pathlib import Path

# Replies HAProxy gives instead of an error status (HAProxy 2.6 runtime API).
_ERROR_PREFIXES = ("No such server", "No such backend", "No such proxy", "Unknown command",
                   "Absolute weight can only be", "Relative weight can only be", "Backend is using a static LB",
                   "Require 'backend/server'", "Permission denied", "Invalid", "Can't")


REPLY_TIMEOUT_FACTOR = 5   # a whole reply may take this many per-read timeouts (show stat of a large HAProxy)
# HAProxy's CLI ends every answer with an empty line: `show stat` is its last row, "\n", then "\n"
REPLY_END = "\n\n"
# A reply is refused past this many bytes: `show stat` is about 1 KB a server, so this is far above any
# real HAProxy and far below a machine's memory (a socket path pointing at something that streams).
MAX_REPLY_BYTES = 64 * 1024 * 1024


class HaproxyError(RuntimeError):
    """The runtime API refused a command or could not be reached; the message says which."""


class HaproxyAPI:
    def __init__(self, socket_path: str | Path, timeout_s: float = 2.0,
                 max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s
        self.max_reply_bytes = max_reply_bytes

    def command(self, cmd: str) -> str:
        if "\n" in cmd or ";" in cmd:
            raise HaproxyError(f"refusing a multi-command line: {cmd!r}")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout_s)
        try:
            s.connect(self.socket_path)
            s.sendall(cmd.encode() + b"\n")
            chunks = []
            size = 0
            # the timeout bounds each read; this bounds the whole reply (a wedged process sending a
            # byte now and then would otherwise hold the caller, and every listener behind it, forever)
            deadline = time.monotonic() + REPLY_TIMEOUT_FACTOR * self.timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout(f"reply not complete after {REPLY_TIMEOUT_FACTOR * self.timeout_s:g}s")
                s.settimeout(min(self.timeout_s, left))
                b = s.recv(65536)
                if not b:
                    break
                size += len(b)
                # the deadline alone let a fast endless stream fill memory for its whole length
                if size > self.max_reply_bytes:
                    raise HaproxyError(f"admin socket {self.socket_path}: {cmd!r} reply larger than "
                                       f"{self.max_reply_bytes} bytes, refused (is this HAProxy's runtime API?)")
                chunks.append(b)
        except FileNotFoundError:
            raise HaproxyError(f"admin socket {self.socket_path} does not exist (HAProxy down or "
                               "`stats socket` not configured)") from None
        except (ConnectionRefusedError, socket.timeout, OSError) as e:
            raise HaproxyError(f"admin socket {self.socket_path}: {e}") from None
        finally:
            s.close()
        reply = b"".join(chunks).decode("utf-8", "replace")
        stripped = reply.strip()
        if stripped.startswith(_ERROR_PREFIXES):
            raise HaproxyError(f"{cmd!r}: {stripped.splitlines()[0]}")
        return reply

    def show_stat(self) -> str:
        return self.command("show stat")

    def get_weight(self, backend: str, server: str) -> tuple[int, int]:
        """Returns (current, initial) weight."""
        reply = self.command(f"get weight {backend}/{server}").strip()
        # HAProxy 2.6 answers "100 (initial 100)"; older versions "100 (initial: 100)".
        m = re.fullmatch(r"(\d+) \(initial:? (\d+)\)", reply)
        if m is None:
            raise HaproxyError(f"get weight {backend}/{server}: unexpected reply {reply[:80]!r}")
        return int(m.group(1)), int(m.group(2))

    def set_weight(self, backend: str, server: str, weight: int) -> None:
        if not 0 <= weight <= 256:
            raise HaproxyError(f"weight {weight} for {backend}/{server} is outside 0..256")
        reply = self.command(f"set weight {backend}/{server} {int(weight)}").strip()
        if reply:
            raise HaproxyError(f"set weight {backend}/{server} {weight}: {reply[:200]}")

    def set_server_state(self, backend: str, server: str, state: str) -> None:
        if state not in ("ready", "drain", "maint"):
            raise HaproxyError(f"unknown server state {state!r}")
        reply = self.command(f"set server {backend}/{server} state {state}").strip()
        if reply:
            raise HaproxyError(f"set server {backend}/{server} state {state}: {reply[:200]}")


class StatParseError(ValueError):
    pass


def reply_torn(text: str) -> bool:
    """The reply ends without HAProxy's end-of-answer empty line: the connection closed mid-answer."""
    return not text.endswith(REPLY_END)


def _torn_message(text: str) -> str:
    return (f"show stat reply torn: {len(text)} bytes without HAProxy's end-of-answer empty line "
            "(connection closed mid-answer: HAProxy reloaded or died, or a proxy in between)")


def parse_show_stat_rows(text: str) -> tuple[list[dict[str, str]], list[str]]:
    """Parse ``show stat`` CSV (header ``# pxname,svname,...``) into one dict per row (strings),
    and one message per refused row.

    A data row must have as many fields as the header (HAProxy ends both with the same trailing
    comma): a shorter one is a reply torn mid-row, and zipping it would emit a cut number (a stot
    of 121 read as 12) as good. Such rows are refused and named; the other rows are kept.
    A missing or wrong header refuses the whole output (StatParseError).

    A reply without its end (:func:`reply_torn`) cut between two rows reads as a whole, smaller round:
    that is the first message. HAProxy dumps proxy by proxy (FRONTEND, servers, BACKEND), so every proxy
    before the last one read is whole and kept; the last one only when closed by its BACKEND row, else
    its rows are refused too (a backend short of servers reads as less demand, a server's state unread
    as serving; missing altogether, its last record ages instead).
    """
    torn = reply_torn(text)
    try:
        rows, errors = _parse_rows(text)
    except StatParseError as e:
        if torn:   # cut before or inside the header: say so, not only that the header is bad
            raise StatParseError(f"{_torn_message(text)}: {e}") from None
        raise
    if not torn:
        return rows, errors
    open_rows = _open_proxy_rows(rows)
    kept = rows[:len(rows) - open_rows]
    cut = f"{_torn_message(text)}; {len(kept)} row(s) of whole proxies kept"
    if open_rows:
        cut += f", the last proxy's {open_rows} refused ({rows[-1].get('pxname', '')[:80]!r}: no BACKEND row)"
    return kept, [cut, *errors]


def _open_proxy_rows(rows: list[dict[str, str]]) -> int:
    """How many trailing rows belong to a proxy whose BACKEND row was not read (0: the last is closed)."""
    if not rows:
        return 0
    last = rows[-1]
    closed = last.get("type") == "1" if "type" in last else last.get("svname") == "BACKEND"
    if closed:
        return 0
    n = 0
    for row in reversed(rows):
        if row.get("pxname") != last.get("pxname"):
            break
        n += 1
    return n


def _parse_rows(text: str) -> tuple[list[dict[str, str]], list[str]]:
    if not text.startswith("# "):
        raise StatParseError(f"show stat output does not start with the '# pxname,...' header: {text[:80]!r}")
    lines = text[2:].splitlines()
    reader = csv.reader(io.StringIO("\n".join(line for line in lines if line.strip())))
    try:
        header = next(reader)
    except StopIteration:
        raise StatParseError("show stat output has no header") from None
    if len(header) < 2 or header[0] != "pxname" or header[1] != "svname":
        raise StatParseError(f"show stat header does not start with pxname,svname: {header[:3]!r}")
    rows: list[dict[str, str]] = []
    errors: list[str] = []
    try:
        for i, row in enumerate(reader, start=2):
            if len(row) != len(header):
                name = "/".join(row[:2])[:80] or "?"
                errors.append(f"show stat line {i} ({name}): {len(row)} columns, expected {len(header)} "
                              f"(torn reply?)")
                continue
            rows.append({h: v for h, v in zip(header, row) if h})
    except csv.Error as e:  # a NUL byte or a field past csv's size limit: the rest cannot be split
        errors.append(f"show stat line {reader.line_num + 1}: {e}")
    return rows, errors


def parse_show_stat(text: str) -> list[dict[str, str]]:
    """All rows of ``show stat``, or StatParseError naming the first refused row (see
    :func:`parse_show_stat_rows`, which keeps the good rows of a partly bad reply)."""
    rows, errors = parse_show_stat_rows(text)
    if errors:
        raise StatParseError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    return rows
