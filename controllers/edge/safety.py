"""The final guard on every controller's weights, whatever its law proposed.

Shares off an unhealthy or unreachable origin move at once; other changes are at most
``max_step`` per origin per interval; rows sum to 1, are never all-zero, and put nothing on an
unhealthy origin while a healthy one is reachable; a row with none holds its weights, but moves
what is on an origin it has no path to onto the reachable ones (those requests fail for certain).
A controller bug therefore cannot take the edge down: the worst it can do is one bounded step.
"""

from __future__ import annotations

import numpy as np

_EPS = 1e-12


def usable_mask(latency: np.ndarray, healthy: np.ndarray) -> np.ndarray:
    """[E, O]: origin healthy and reachable from the edge."""
    return np.isfinite(latency) & np.asarray(healthy, dtype=bool)[None, :]


def nearest_rows(latency: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """[E, O]: each row all on its nearest usable origin (all-zero for a row with none)."""
    rows = np.zeros(latency.shape)
    has = usable.any(axis=1)
    idx = np.argmin(np.where(usable, latency, np.inf), axis=1)
    rows[np.flatnonzero(has), idx[has]] = 1.0
    return rows


def strip_unusable(previous: np.ndarray, proposal: np.ndarray, usable: np.ndarray,
                   latency: np.ndarray) -> np.ndarray:
    """Move every share on an unusable origin at once to the usable ones: first where
    ``proposal`` wants more than the row has, in proportion to that shortfall, the rest as
    ``proposal`` splits the row (else to the nearest). Rows with no usable origin are left as they
    are (fail static)."""
    out = np.array(previous, dtype=float, copy=True)
    has_usable = usable.any(axis=1)
    bad = ~usable & (out > 0) & has_usable[:, None]
    rows = np.flatnonzero(bad.any(axis=1))
    if rows.size == 0:
        return out
    dest = np.where(usable, np.clip(proposal, 0.0, None), 0.0)
    empty = dest.sum(axis=1) <= _EPS
    dest[empty] = nearest_rows(latency, usable)[empty]
    dest /= np.where(dest.sum(axis=1, keepdims=True) > 0, dest.sum(axis=1, keepdims=True), 1.0)
    mass = np.where(bad, out, 0.0).sum(axis=1)
    out[bad] = 0.0
    # fill the proposal's shortfalls first, so the evacuated share lands where it is wanted
    shortfall = np.where(usable, np.clip(dest - out, 0.0, None), 0.0)
    short_total = shortfall.sum(axis=1)
    to_fill = np.minimum(mass, short_total)
    scale = np.divide(to_fill, short_total, out=np.zeros_like(to_fill), where=short_total > _EPS)
    out[rows] += shortfall[rows] * scale[rows, None]
    out[rows] += (mass - to_fill)[rows, None] * dest[rows]
    return out


def enforce_safety(previous: np.ndarray, proposal: np.ndarray, latency: np.ndarray,
                   healthy: np.ndarray, max_step: float) -> np.ndarray:
    """The final guard, whatever the proposal (module docstring).

    Returns rows that sum to 1, are never all-zero, have nothing on an unusable origin when a usable
    one exists, and differ from ``previous`` by at most ``max_step`` per origin except for the share
    moved off unusable origins.
    """
    prev = np.clip(np.nan_to_num(np.asarray(previous, dtype=float)), 0.0, None)
    prop = np.clip(np.nan_to_num(np.asarray(proposal, dtype=float)), 0.0, None)
    usable = usable_mask(latency, healthy)
    has_usable = usable.any(axis=1)
    nearest = nearest_rows(latency, usable)
    # a previous row that is all-zero is not a decision: start from the nearest usable origin
    prev_empty = prev.sum(axis=1) <= _EPS
    prev[prev_empty & has_usable] = nearest[prev_empty & has_usable]
    prev[prev_empty & ~has_usable] = 1.0
    prev /= prev.sum(axis=1, keepdims=True)

    prop = np.where(usable, prop, 0.0)
    base = strip_unusable(prev, prop, usable, latency)
    # a row with no usable origin holds its weights (fail static on health), but not on an origin
    # it has no path to: that share fails for certain, and moves to the reachable ones
    reachable = np.isfinite(np.asarray(latency, dtype=float))
    cut_off = ~has_usable & reachable.any(axis=1)
    if cut_off.any():
        base[cut_off] = strip_unusable(prev, prev, reachable, latency)[cut_off]
    # an empty proposal, or a row with no usable origin, holds (the stripped) previous weights
    prop_empty = (prop.sum(axis=1) <= _EPS) | ~has_usable
    prop[prop_empty] = base[prop_empty]
    prop /= prop.sum(axis=1, keepdims=True)
    delta = prop - base
    biggest = np.abs(delta).max(axis=1)
    alpha = np.where(biggest > max_step, max_step / np.maximum(biggest, _EPS), 1.0)
    out = base + alpha[:, None] * delta
    out = np.clip(out, 0.0, None)
    out[~usable & has_usable[:, None]] = 0.0
    return out / out.sum(axis=1, keepdims=True)

