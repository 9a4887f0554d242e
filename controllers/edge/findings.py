"""Findings raised by an edge-weight decision: shedding (capacity short) and fail-static holds.

The stream stage publishes these on the ``findings`` topic next to the ``edge.weights`` records;
one finding per listener and condition (so re-publishing updates it), cleared when the condition
goes away (``cleared=True`` from :func:`decision_findings` with ``include_cleared``).
"""

from __future__ import annotations

from opsloop.records import Finding, Severity

from opsloop.controllers.edge.base import Decision
from opsloop.records import Mode

SHED_DETECTOR = "edge.capacity_shortfall"
HOLD_DETECTOR = "edge.weights_held"
RUNBOOK = "controllers/edge/README.md"


def decision_findings(decision: Decision, listener: str, edges: list[str], now: float,
                      include_cleared: bool = False) -> list[Finding]:
    """Open findings for a decision (and, optionally, cleared ones for conditions that ended)."""
    out: list[Finding] = []
    shortfall = float(decision.shed_rps.sum())
    demand = float(decision.demand_estimate.sum())
    if decision.stale:
        pass  # nothing was planned on stale inputs: the shortfall is unknown, leave it as it was
    elif shortfall > 0:
        fraction = shortfall / demand if demand > 0 else 1.0
        worst = sorted(((float(s), e) for s, e in zip(decision.shed_rps, edges) if s > 0),
                       reverse=True)[:5]
        # an edge that sheds all its demand reaches no healthy origin with capacity: it is not served
        # "the same fraction" as the others, it is not served at all
        unserved = [e for e, s, d in zip(edges, decision.shed_rps, decision.demand_estimate) if 0 < d <= s]
        fair = (f"nothing served at edge(s) {', '.join(unserved)} (no healthy origin with capacity reachable)"
                if unserved else "every edge served the same fraction")
        out.append(Finding(
            detector=SHED_DETECTOR, what="healthy origin capacity short: traffic shed fairly",
            where={"listener": listener}, observed=round(shortfall, 3), expected=0.0,
            score=min(1.0, fraction), severity=Severity.CRITICAL if fraction > 0.1 else Severity.WARNING,
            explanation=(f"{shortfall:.1f} req/s ({fraction:.1%}) of {demand:.1f} req/s above healthy "
                         f"capacity·(1-headroom); {fair}. Largest: "
                         + ", ".join(f"{e} {s:.1f} req/s" for s, e in worst)),
            first_seen=now, last_seen=now, runbook=RUNBOOK))
    elif include_cleared:
        out.append(Finding(detector=SHED_DETECTOR, what="healthy origin capacity short",
                           where={"listener": listener}, observed=0.0, expected=0.0, score=0.0,
                           first_seen=now, last_seen=now, cleared=True, runbook=RUNBOOK))
    if decision.mode in (Mode.HOLD, Mode.FALLBACK):
        out.append(Finding(
            detector=HOLD_DETECTOR, what=f"edge weights {decision.mode.value}: not following inputs",
            where={"listener": listener}, observed=decision.inputs_age_s, expected=0.0,
            severity=Severity.CRITICAL if decision.mode is Mode.FALLBACK else Severity.WARNING,
            explanation=decision.reason, first_seen=now, last_seen=now, runbook=RUNBOOK))
    elif include_cleared:
        out.append(Finding(detector=HOLD_DETECTOR, what="edge weights held",
                           where={"listener": listener}, score=0.0, first_seen=now, last_seen=now,
                           cleared=True, runbook=RUNBOOK))
    return out
