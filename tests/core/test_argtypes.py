"""opsloop.argtypes: numbers on the command line, bounded and finite, or argparse's one-line error."""

from __future__ import annotations

import argparse

import pytest

from opsloop.argtypes import INT64_MAX, finite, integer


@pytest.mark.parametrize("text, message", [
    ("x", "not an integer: 'x'"), ("1.5", "not an integer: '1.5'"), ("-1", "expected an integer >= 0, got -1"),
    (str(INT64_MAX + 1), f"expected an integer 0 to {INT64_MAX}, got {INT64_MAX + 1}")])
def test_integer_refuses_what_is_not_a_64_bit_integer_in_range(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message.replace("(", r"\(")) as e:
        integer(0)(text)
    assert str(e.value) == message


def test_integer_takes_its_bounds() -> None:
    assert integer(0)("0") == 0 and integer(0)(str(INT64_MAX)) == INT64_MAX and integer(1, 5)("5") == 5
    with pytest.raises(argparse.ArgumentTypeError, match="expected an integer 1 to 5, got 6"):
        integer(1, 5)("6")


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-0.5", "abc", ""])
def test_finite_refuses_nan_inf_below_and_text(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        finite(0)(text)


def test_finite_low_bound_open_or_closed() -> None:
    assert finite(0)("0") == 0.0 and finite(0, low_ok=False)("0.1") == 0.1
    with pytest.raises(argparse.ArgumentTypeError, match="expected a finite number > 0, got 0"):
        finite(0, low_ok=False)("0")
