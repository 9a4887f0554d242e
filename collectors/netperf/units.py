"""Throughput units as the tools print them, converted to bits per second.

netperf's ``THROUGHPUT_UNITS`` follows its ``-f`` option (netlib.c ``calc_thruput``): the lower-case
formats are decimal *bits* (``-f k/m/g`` print ``10^3bits/s``, ``10^6bits/s``, ``10^9bits/s``), the
upper-case ones are binary *bytes* (``-f K/M/G`` print ``KBytes/s`` = 1024, ``MBytes/s`` = 1024^2,
``GBytes/s`` = 1024^3 bytes per second; ``-f B`` prints ``Bytes/s``). Mixing these up is a factor of
8 (bits vs bytes) and up to 7 % (1000^3 vs 1024^3), so every unit we accept is listed here explicitly.
iperf3's JSON always carries ``bits_per_second``.
"""

from __future__ import annotations

import re

BITS_PER_GIGABIT = 1e9

# Byte-based units, binary multiples (netperf: 'K' divides by 1024.0, 'M' by 1024.0 * 1024.0, ...).
_BYTE_UNITS: dict[str, float] = {
    "Bytes/s": 8.0,
    "KBytes/s": 8.0 * 1024,
    "MBytes/s": 8.0 * 1024**2,
    "GBytes/s": 8.0 * 1024**3,
}
# Bit-based units, decimal multiples: netperf writes them as a power of ten.
_DECIMAL_BITS = re.compile(r"^10\^(\d{1,2})bits/s$")


class UnitError(ValueError):
    """A throughput unit we do not know how to convert (the message names it)."""


def bits_per_second_factor(unit: str) -> float:
    """How many bits per second one ``unit`` is; raises UnitError for anything not listed above."""
    unit = unit.strip()
    if unit in _BYTE_UNITS:
        return _BYTE_UNITS[unit]
    m = _DECIMAL_BITS.match(unit)
    if m:
        return 10.0 ** int(m.group(1))
    if unit == "Trans/s":
        raise UnitError("throughput unit 'Trans/s' is a request/response rate, not a bit rate: "
                        "use a *_STREAM test")
    raise UnitError(f"unknown throughput unit {unit[:40]!r} (expected 10^Nbits/s, Bytes/s, KBytes/s, "
                    "MBytes/s or GBytes/s)")


def to_bits_per_second(value: float, unit: str) -> float:
    return value * bits_per_second_factor(unit)


def to_gbps(bits_per_second: float) -> float:
    """Gb/s, decimal, as the source documents report (3.57 Gb/s = 3.57e9 bits/s)."""
    return bits_per_second / BITS_PER_GIGABIT
