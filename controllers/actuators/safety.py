"""Pure safety rules of the actuator (property-tested): bounded step, releasing DOWN origins, diff,
write order of a batch.

``bound_step`` moves from the live shares towards the decision by at most ``max_step`` per origin,
except that the share of a *releasable* origin (decision share 0 and reported DOWN by the load
balancer) is moved off at once, onto the origins the decision wants to grow. The result is a convex
combination of distributions, so it sums to 1 and is never negative.
"""

from __future__ import annotations

import math

EPS = 1e-12


def bound_step(previous: dict[str, float], decision: dict[str, float], max_step: float,
               releasable: set[str] | frozenset[str] = frozenset()) -> dict[str, float]:
    """Shares over ``decision``'s origins; see the module docstring."""
    origins = list(decision)
    prev = {o: max(0.0, previous.get(o, 0.0)) for o in origins}
    mass = math.fsum(prev.values())
    if mass <= EPS:  # nothing live to step from (a fresh LB or all quiesced): the decision itself
        return dict(decision)
    prev = {o: v / mass for o, v in prev.items()}
    release = {o for o in releasable if o in prev and decision.get(o, 0.0) <= 0.0}
    freed = math.fsum(prev[o] for o in release)
    base = {o: (0.0 if o in release else prev[o]) for o in origins}
    if freed > EPS:
        gaps = {o: max(0.0, decision[o] - prev[o]) for o in origins if o not in release}
        gap_total = math.fsum(gaps.values())
        if gap_total <= EPS:  # cannot happen for a decision summing to 1; be safe anyway
            gaps = {o: decision[o] for o in gaps}
            gap_total = math.fsum(gaps.values()) or 1.0
        for o, g in gaps.items():
            base[o] += freed * g / gap_total
    biggest = max(abs(decision[o] - base[o]) for o in origins)
    alpha = 1.0 if biggest <= max_step else max_step / biggest
    out = {o: base[o] + alpha * (decision[o] - base[o]) for o in origins}
    total = math.fsum(out.values())
    if total <= EPS:  # an all-zero decision: the caller refuses it
        return {o: 0.0 for o in origins}
    return {o: max(0.0, v) / total for o, v in out.items()}


def increases_first(new: dict[str, int], current: dict[str, int]) -> list[str]:
    """The origins of ``new`` in write order: increases, then unchanged, then decreases (stable).

    LB batches are not atomic (HAProxy ``set weight`` one by one, ``ipvsadm -R`` line by line): a
    batch torn after any prefix in this order leaves every server at its old or new weight and a total
    no lower than the smaller of the old and new totals, so never all-zero when neither end is."""
    def rank(o: str) -> int:
        old = current.get(o)
        if old is None or new[o] == old:
            return 1
        return 0 if new[o] > old else 2
    return sorted(new, key=rank)


def reaches(applied: dict[str, float], decision: dict[str, float], tol: float = 1e-9) -> bool:
    return all(abs(applied.get(o, 0.0) - s) <= tol for o, s in decision.items())


def share_difference(live: dict[str, float], decision: dict[str, float]) -> float:
    """Total variation distance: the fraction of traffic that would move (0 = same, 1 = disjoint)."""
    keys = set(live) | set(decision)
    return 0.5 * math.fsum(abs(live.get(k, 0.0) - decision.get(k, 0.0)) for k in keys)
