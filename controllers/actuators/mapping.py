"""Shares (summing to 1) -> integer load-balancer weights, and back.

Largest-remainder rounding keeps the integer weights as close to the shares as the range allows and
makes them sum to exactly ``total``. Two rules on top: a share > 0 never rounds to 0 (that would
quiesce an origin the controller wants to use), and 0 only for a share of exactly 0 (quiesce).
"""

from __future__ import annotations

import math

HAPROXY_MAX_WEIGHT = 256     # `set weight be/srv N`: 0..256
IPVS_MAX_WEIGHT = 65535      # ipvsadm -w: 0..65535, 0 = quiesce


class MappingError(ValueError):
    """Shares that cannot be mapped; the message names the origin and value."""


def to_integer_weights(shares: dict[str, float], total: int) -> dict[str, int]:
    """Integer weights summing to ``total`` (when every positive share can get at least 1)."""
    if total < 1:
        raise MappingError(f"total weight must be >= 1, got {total}")
    for origin, share in shares.items():
        if isinstance(share, bool) or not isinstance(share, (int, float)) or math.isnan(share) or share < 0 \
                or math.isinf(share):
            raise MappingError(f"share of {origin!r} must be a finite number >= 0, got {share!r}")
    positive = [o for o, s in shares.items() if s > 0]
    if not positive:
        return {o: 0 for o in shares}
    if len(positive) > total:
        raise MappingError(f"{len(positive)} origins with a share > 0 cannot all get a weight >= 1 out of {total}")
    mass = math.fsum(shares[o] for o in positive)
    exact = {o: shares[o] / mass * total for o in positive}
    weights = {o: math.floor(v) for o, v in exact.items()}
    left = total - sum(weights.values())
    # largest remainders first; ties broken by name so the result is deterministic
    for o in sorted(positive, key=lambda o: (-(exact[o] - weights[o]), o))[:left]:
        weights[o] += 1
    # a positive share never rounds to 0: take the weight from the origin that can best afford it
    for o in sorted(positive):
        if weights[o] == 0:
            donor = max((d for d in positive if weights[d] >= 2), key=lambda d: (weights[d] - exact[d], weights[d], d))
            weights[donor] -= 1
            weights[o] = 1
    return {o: weights.get(o, 0) for o in shares}


def to_shares(weights: dict[str, int]) -> dict[str, float]:
    """Integer weights -> shares; all-zero weights give all-zero shares (no traffic at all)."""
    total = sum(weights.values())
    if total <= 0:
        return {o: 0.0 for o in weights}
    return {o: w / total for o, w in weights.items()}
