"""Shares -> integer weights (largest remainder) and the pure safety rules, as properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from opsloop.controllers.actuators.mapping import MappingError, to_integer_weights, to_shares
from opsloop.controllers.actuators.safety import bound_step, share_difference

ORIGINS = ["a", "b", "c", "d", "e"]


@st.composite
def share_rows(draw: st.DrawFn, min_size: int = 1) -> dict[str, float]:
    n = draw(st.integers(min_value=min_size, max_value=len(ORIGINS)))
    raw = draw(st.lists(st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1.0)), min_size=n, max_size=n))
    if sum(raw) <= 0:
        raw[draw(st.integers(0, n - 1))] = 1.0
    total = math.fsum(raw)
    return {o: v / total for o, v in zip(ORIGINS, raw)}


@settings(max_examples=300, deadline=None)
@given(share_rows(), st.sampled_from([256, 100, 10_000, 65535, 7]))
def test_integer_weights_keep_the_shares(shares: dict[str, float], total: int) -> None:
    weights = to_integer_weights(shares, total)
    assert set(weights) == set(shares)
    assert sum(weights.values()) == total
    for o, s in shares.items():
        assert 0 <= weights[o] <= total
        assert (weights[o] == 0) == (s == 0.0), (o, s, weights)
        # largest remainder is within one unit of the exact value, plus the units moved to keep shares > 0
        moved = sum(1 for v in shares.values() if 0 < v * total < 1)
        assert abs(weights[o] - s * total) <= 1 + moved


def test_small_share_never_rounds_to_zero() -> None:
    assert to_integer_weights({"big": 0.999, "tiny": 0.001}, 256) == {"big": 255, "tiny": 1}
    assert to_integer_weights({"a": 0.5, "b": 0.5, "c": 0.0}, 256) == {"a": 128, "b": 128, "c": 0}
    assert to_integer_weights({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 100) == {"a": 34, "b": 33, "c": 33}


def test_bad_shares_are_named() -> None:
    with pytest.raises(MappingError, match="'x'"):
        to_integer_weights({"x": float("nan")}, 256)
    with pytest.raises(MappingError, match="cannot all get a weight"):
        to_integer_weights({"a": 0.5, "b": 0.5}, 1)


@settings(max_examples=300, deadline=None)
@given(share_rows(min_size=2), share_rows(min_size=2), st.floats(min_value=0.01, max_value=1.0))
def test_bounded_step_without_release(prev: dict[str, float], decision: dict[str, float], max_step: float) -> None:
    keys = [o for o in ORIGINS if o in prev or o in decision]
    decision = {o: decision.get(o, 0.0) for o in keys}
    out = bound_step(prev, decision, max_step)
    assert math.isclose(math.fsum(out.values()), 1.0, abs_tol=1e-9)
    for o in keys:
        assert out[o] >= 0
        assert abs(out[o] - prev.get(o, 0.0)) <= max_step + 1e-9
        lo, hi = sorted((prev.get(o, 0.0), decision[o]))
        assert lo - 1e-9 <= out[o] <= hi + 1e-9  # moves towards the decision, never past it
    if max(abs(decision[o] - prev.get(o, 0.0)) for o in keys) <= max_step:
        assert all(math.isclose(out[o], decision[o], abs_tol=1e-9) for o in keys)


@settings(max_examples=300, deadline=None)
@given(share_rows(min_size=3), share_rows(min_size=3), st.floats(min_value=0.01, max_value=1.0), st.data())
def test_bounded_step_releases_down_origins(prev: dict[str, float], decision: dict[str, float], max_step: float,
                                            data: st.DataObject) -> None:
    keys = [o for o in ORIGINS if o in prev or o in decision]
    decision = {o: decision.get(o, 0.0) for o in keys}
    zero = [o for o in keys if decision[o] == 0.0]
    releasable = set(data.draw(st.lists(st.sampled_from(zero), unique=True))) if zero else set()
    out = bound_step(prev, decision, max_step, releasable)
    assert math.isclose(math.fsum(out.values()), 1.0, abs_tol=1e-9)
    assert sum(out.values()) > 0
    for o in releasable:
        assert out[o] == 0.0  # moved off at once, whatever max_step
    freed = sum(prev.get(o, 0.0) for o in releasable)
    for o in keys:
        if o not in releasable:
            # bounded, except for the released share it may receive
            assert abs(out[o] - prev.get(o, 0.0)) <= max_step + freed + 1e-9


@given(share_rows(), share_rows())
def test_share_difference_is_a_distance(a: dict[str, float], b: dict[str, float]) -> None:
    d = share_difference(a, b)
    assert 0.0 <= d <= 1.0 + 1e-9
    assert share_difference(a, a) == 0.0
    assert math.isclose(d, share_difference(b, a))


def test_to_shares() -> None:
    assert to_shares({"a": 3, "b": 1}) == {"a": 0.75, "b": 0.25}
    assert to_shares({"a": 0, "b": 0}) == {"a": 0.0, "b": 0.0}
