"""Parsers for one stream's result: netperf omni output (``-- -o`` CSV or ``-- -k`` KEY=value) and
``iperf3 -J`` JSON. Every parser returns a :class:`StreamResult` in bits per second or raises
:class:`ParseError` (or :class:`ToolReportedError` when the tool itself reported a failure) with a
message that names what was wrong and keeps the first bytes of the output. Nothing else escapes.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from opsloop.collectors.netperf.units import UnitError, to_bits_per_second

# The omni output selectors we ask netperf for, in this order (``-- -o`` / ``-- -k``).
OMNI_SELECTORS: tuple[str, ...] = ("THROUGHPUT", "THROUGHPUT_UNITS", "ELAPSED_TIME", "PROTOCOL")
PREVIEW_BYTES = 120

_KEY_VALUE = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")

OmniFormat = Literal["keyval", "csv"]


class ParseError(ValueError):
    """Output that does not parse. The message names the problem and shows the output's first bytes."""


class ToolReportedError(RuntimeError):
    """The tool ran and reported an error in its own output (e.g. iperf3's JSON ``error`` key)."""


@dataclass(frozen=True, slots=True)
class StreamResult:
    """One stream's measurement."""

    bits_per_second: float
    elapsed_s: float | None = None
    protocol: str | None = None
    retransmits: int | None = None


def preview(text: str | bytes, limit: int = PREVIEW_BYTES) -> str:
    """The first bytes of some output, printable, for an error message."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "backslashreplace")
    text = text.strip()
    shown = text[:limit]
    return repr(shown + ("..." if len(text) > limit else ""))


def parse_omni_csv(text: str, selectors: tuple[str, ...] = OMNI_SELECTORS) -> dict[str, str]:
    """``-- -o A,B,C`` output: one comma-separated line (the last non-empty one; with ``-P 1`` a
    banner and a header line come first and are ignored)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ParseError("netperf printed nothing (expected one line of omni CSV output)")
    values = lines[-1].split(",")
    if len(values) != len(selectors):
        raise ParseError(f"netperf omni CSV line has {len(values)} fields, expected {len(selectors)} "
                         f"({','.join(selectors)}): {preview(text)}")
    return dict(zip(selectors, (v.strip() for v in values)))


def parse_omni_keyval(text: str) -> dict[str, str]:
    """``-- -k A,B,C`` output: ``KEY=value`` lines. Lines of another shape (a banner) are ignored;
    a key given twice is an error because we could not tell which value is the result."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _KEY_VALUE.match(line.strip())
        if not m:
            continue
        key, value = m.group(1), m.group(2).strip()
        if key in out:
            raise ParseError(f"netperf omni output repeats key {key}: {preview(text)}")
        out[key] = value
    if not out:
        raise ParseError(f"netperf output has no KEY=value lines: {preview(text)}")
    return out


def _number(raw: str, what: str, text: str) -> float:
    try:
        x = float(raw)
    except ValueError:
        raise ParseError(f"{what} {raw[:40]!r} is not a number: {preview(text)}") from None
    if not math.isfinite(x) or x < 0:
        raise ParseError(f"{what} {raw[:40]!r} is not a finite, non-negative number: {preview(text)}")
    return x


def result_from_omni(values: dict[str, str], text: str = "") -> StreamResult:
    """Build a StreamResult from omni selector values (THROUGHPUT and THROUGHPUT_UNITS required)."""
    for key in ("THROUGHPUT", "THROUGHPUT_UNITS"):
        if key not in values:
            raise ParseError(f"netperf output lacks {key}: {preview(text)}")
    throughput = _number(values["THROUGHPUT"], "THROUGHPUT", text)
    try:
        bps = to_bits_per_second(throughput, values["THROUGHPUT_UNITS"])
    except UnitError as e:
        raise ParseError(f"{e}: {preview(text)}") from None
    # A finite reading can overflow once scaled (1e308 GBytes/s): check what we emit, not what was read.
    if not math.isfinite(bps):
        raise ParseError(f"THROUGHPUT {values['THROUGHPUT'][:40]!r} {values['THROUGHPUT_UNITS'][:20]} is not a "
                         f"finite bit rate once converted to bits/s: {preview(text)}")
    elapsed = _number(values["ELAPSED_TIME"], "ELAPSED_TIME", text) if values.get("ELAPSED_TIME") else None
    return StreamResult(bits_per_second=bps, elapsed_s=elapsed, protocol=values.get("PROTOCOL") or None)


def parse_netperf(text: str, fmt: OmniFormat = "keyval") -> StreamResult:
    """One netperf run's stdout, in the omni format we asked for."""
    values = parse_omni_keyval(text) if fmt == "keyval" else parse_omni_csv(text)
    return result_from_omni(values, text)


def _path(doc: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(doc, dict) or k not in doc:
            return None
        doc = doc[k]
    return doc


def parse_iperf3(text: str) -> StreamResult:
    """``iperf3 -c ... -J`` output. Throughput is what the receiver got (``end.sum_received``: data
    still queued at the sender when the test ends is not counted); retransmits from ``end.sum_sent``."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ParseError(f"iperf3 output is not JSON ({e.__class__.__name__}): {preview(text)}") from None
    if not isinstance(doc, dict):
        raise ParseError(f"iperf3 output is a JSON {type(doc).__name__}, expected an object: {preview(text)}")
    error = doc.get("error")
    if error:
        raise ToolReportedError(f"iperf3: {str(error)[:200]}")
    received = _path(doc, "end", "sum_received")
    if not isinstance(received, dict):
        raise ParseError(f"iperf3 JSON lacks end.sum_received (not a TCP test?): {preview(text)}")
    bps = received.get("bits_per_second")
    if isinstance(bps, bool) or not isinstance(bps, (int, float)) or not math.isfinite(bps) or bps < 0:
        raise ParseError(f"iperf3 end.sum_received.bits_per_second is {bps!r}, expected a non-negative "
                         f"number: {preview(text)}")
    seconds = received.get("seconds")
    elapsed = float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) \
        and math.isfinite(seconds) and seconds >= 0 else None
    retrans = _path(doc, "end", "sum_sent", "retransmits")
    retransmits = retrans if isinstance(retrans, int) and not isinstance(retrans, bool) and retrans >= 0 else None
    protocol = _path(doc, "start", "test_start", "protocol")
    return StreamResult(bits_per_second=float(bps), elapsed_s=elapsed,
                        protocol=protocol if isinstance(protocol, str) else None, retransmits=retransmits)
