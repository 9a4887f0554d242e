"""argparse ``type=`` callables for numbers on the command line: a bad value is argparse's one-line
usage error naming the option (exit 2), never a traceback, and never a value that breaks what reads it
later (nan or inf as a rate, a negative count, an integer wider than 64 bits in the JSON log lines)."""

from __future__ import annotations

import argparse
import math
from typing import Callable

INT64_MAX = 2 ** 63 - 1


def integer(low: int, high: int = INT64_MAX, what: str = "an integer") -> Callable[[str], int]:
    """An integer in ``[low, high]``."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= v <= high:
            bound = f">= {low}" if v < low and high == INT64_MAX else f"{low} to {high}"
            raise argparse.ArgumentTypeError(f"expected {what} {bound}, got {text}")
        return v
    return parse


def finite(low: float, *, low_ok: bool = True) -> Callable[[str], float]:
    """A finite number at least ``low`` (above it when not ``low_ok``)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(v) or v < low or (v == low and not low_ok):
            raise argparse.ArgumentTypeError(f"expected a finite number {'>=' if low_ok else '>'} {low:g}, got {text}")
        return v
    return parse
