"""Is a VM port protected by its Neutron security-group chains?

Neutron's iptables firewall driver (hybrid OVS or linuxbridge) builds, in the filter table::

    FORWARD -j neutron-openvswi-FORWARD
    neutron-openvswi-FORWARD -m physdev --physdev-out tapX --physdev-is-bridged -j neutron-openvswi-sg-chain
    neutron-openvswi-FORWARD -m physdev --physdev-in  tapX --physdev-is-bridged -j neutron-openvswi-sg-chain
    neutron-openvswi-sg-chain -m physdev --physdev-out tapX ... -j neutron-openvswi-i<id>   (to the VM)
    neutron-openvswi-sg-chain -m physdev --physdev-in  tapX ... -j neutron-openvswi-o<id>   (from the VM)
    neutron-openvswi-sg-chain -j ACCEPT
    neutron-openvswi-i<id> ... -j neutron-openvswi-sg-fallback     (-> DROP)
    neutron-openvswi-o<id> -j neutron-openvswi-s<id>               (anti-spoofing)

A port is protected when, walking from the built-in FORWARD chain as a packet to (ingress) or
from (egress) its tap device would, the walk reaches the port's ingress and egress chains, and
the ingress chain ends in a DROP/REJECT (its own or its fallback chain's). The walk honours
physdev conditions for this device and stops at an unconditional ACCEPT/DROP/REJECT/RETURN, an
unconditional goto, or an unconditional jump into a chain that always gives a verdict, so a blanket
``-A FORWARD -j ACCEPT`` (or ``-A neutron-filter-top -j ACCEPT``) before Neutron's jump shadows every port. Other
match conditions (addresses, conntrack state, ...) are assumed to be able to match.

The incident of "Temporary elevated reachability" is exactly the case of present-looking
configuration with the chains or the jumps gone; both make the port unprotected here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from opsloop.collectors.iptables.parse import Chain, Rule, Ruleset

Direction = Literal["ingress", "egress"]
_TERMINAL = frozenset({"ACCEPT", "DROP", "REJECT", "RETURN"})
_DENY = frozenset({"DROP", "REJECT"})
_VERDICTS = frozenset({"ACCEPT", "DROP", "REJECT"})
_MAX_DEPTH = 32  # iptables itself limits nesting; guards against jump loops in bad input


@dataclass(frozen=True, slots=True)
class PortChains:
    ingress: str
    egress: str
    spoof: str


def port_chains(chain_prefix: str, port_id: str) -> PortChains:
    short = port_id[:10]
    return PortChains(f"{chain_prefix}-i{short}", f"{chain_prefix}-o{short}", f"{chain_prefix}-s{short}")


def default_device(port_id: str) -> str:
    return f"tap{port_id[:11]}"


@dataclass(frozen=True, slots=True)
class PortStatus:
    ingress_chain: bool
    egress_chain: bool
    spoof_chain: bool
    ingress_jump: bool
    egress_jump: bool
    ingress_rules: int
    egress_rules: int
    spoof_rules: int
    ingress_default_drop: bool
    reason: str  # empty when protected; otherwise the first problem found, for the page

    @property
    def protected(self) -> bool:
        return not self.reason


def analyze_port(ruleset: Ruleset, chain_prefix: str, port_id: str, device: str) -> PortStatus:
    chains = port_chains(chain_prefix, port_id)
    ingress = ruleset.chain("filter", chains.ingress)
    egress = ruleset.chain("filter", chains.egress)
    spoof = ruleset.chain("filter", chains.spoof)
    ingress_jump = ingress is not None and _reaches(ruleset, "FORWARD", chains.ingress, device, "ingress")
    egress_jump = egress is not None and _reaches(ruleset, "FORWARD", chains.egress, device, "egress")
    default_drop = ingress is not None and _ends_in_deny(ruleset, ingress, set())

    if ingress is None:
        reason = f"ingress chain {chains.ingress} missing"
    elif egress is None:
        reason = f"egress chain {chains.egress} missing"
    elif not ingress_jump:
        reason = f"no jump to {chains.ingress} for traffic to {device} on the FORWARD path"
    elif not egress_jump:
        reason = f"no jump to {chains.egress} for traffic from {device} on the FORWARD path"
    elif not default_drop:
        reason = f"{chains.ingress} does not end in DROP/REJECT (unmatched traffic is let through)"
    else:
        reason = ""
    return PortStatus(
        ingress_chain=ingress is not None, egress_chain=egress is not None, spoof_chain=spoof is not None,
        ingress_jump=ingress_jump, egress_jump=egress_jump,
        ingress_rules=len(ingress.rules) if ingress else 0,
        egress_rules=len(egress.rules) if egress else 0,
        spoof_rules=len(spoof.rules) if spoof else 0,
        ingress_default_drop=default_drop, reason=reason,
    )


def _applies(rule: Rule, device: str, direction: Direction) -> bool:
    """Can a packet to (ingress) / from (egress) ``device`` match this rule's physdev conditions?"""
    towards, away = (rule.physdev_out, rule.physdev_in) if direction == "ingress" else (rule.physdev_in, rule.physdev_out)
    if towards is not None and not towards.matches(device):
        return False
    # A bridged packet has one in- and one out-port; it cannot enter and leave through the same tap.
    if away is not None and not away.negated and away.matches(device):
        return False
    return True


def _reaches(ruleset: Ruleset, start: str, goal: str, device: str, direction: Direction) -> bool:
    # Only chains that can jump on to the goal matter for finding it (others only for where a chain stops):
    # the walk was quadratic in ports, Neutron's FORWARD and sg-chain holding two rules per port (1000 ports: 54 s).
    relevant = _leads_to(ruleset, goal)
    seen: set[str] = set()
    queued: dict[str, int] = {}   # chain -> the least depth it was pushed at
    decides: dict[str, bool] = {}
    stack = [(start, 0)]
    while stack:
        name, depth = stack.pop()
        if name in seen or depth > _MAX_DEPTH:
            continue
        seen.add(name)
        chain = ruleset.chain("filter", name)
        if chain is None:
            continue
        for rule in chain.rules:
            # A conditional rule neither ends the chain nor decides: it matters only if it jumps towards the goal,
            # and only once per target chain. Skipped before the (costlier) physdev test.
            if rule.conditions and (rule.target not in relevant
                                    or queued.get(rule.target, _MAX_DEPTH + 2) <= depth + 1):
                continue
            if not _applies(rule, device, direction):
                continue
            if rule.target == goal:
                return True
            sub = ruleset.chain("filter", rule.target) if rule.target and rule.target not in _TERMINAL else None
            if sub is not None:
                stack.append((sub.name, depth + 1))
                queued[sub.name] = min(queued.get(sub.name, depth + 1), depth + 1)
            # Later rules of this chain are unreachable after an unconditional verdict, an unconditional
            # goto (it never comes back here), or an unconditional jump into a chain that always decides:
            # an ACCEPT inside neutron-filter-top ends the packet's walk as surely as one in FORWARD.
            if rule.unconditional and (rule.target in _TERMINAL or rule.goto
                                       or (sub is not None and _always_decides(ruleset, sub, device, direction,
                                                                               decides))):
                break
    return False


def _leads_to(ruleset: Ruleset, goal: str) -> set[str]:
    """The goal and every filter chain with a path of jumps/gotos to it, conditions aside."""
    parents = ruleset.jumped_from("filter")
    found, todo = {goal}, [goal]
    while todo:
        for parent in parents.get(todo.pop(), ()):
            if parent not in found:
                found.add(parent)
                todo.append(parent)
    return found


def _always_decides(ruleset: Ruleset, chain: Chain, device: str, direction: Direction,
                    memo: dict[str, bool]) -> bool:
    """Does every packet to/from ``device`` entering ``chain`` get its verdict (ACCEPT/DROP/REJECT) there,
    never coming back to the caller? A RETURN that may match, or a goto into a chain that may return, says no."""
    if chain.name in memo:
        return memo[chain.name]
    memo[chain.name] = False   # a jump loop (or a chain being decided): may return
    if len(memo) > 4 * _MAX_DEPTH:
        return False
    result = False
    for rule in chain.rules:
        # A conditional jump (not a goto, not a RETURN) brings the packet back here whatever the chain it jumps to
        # does: it neither decides nor ends this chain, so it is not walked (Neutron has two per VM port).
        if rule.target is None or (rule.conditions and not rule.goto and rule.target != "RETURN"):
            continue
        if not _applies(rule, device, direction):
            continue
        if rule.target == "RETURN":
            break
        sub = ruleset.chain("filter", rule.target) if rule.target not in _TERMINAL else None
        sub_decides = sub is not None and _always_decides(ruleset, sub, device, direction, memo)
        if rule.goto and not sub_decides:
            break   # the goto'd chain may end: the packet goes back to our caller
        if rule.unconditional and (rule.target in _VERDICTS or sub_decides):
            result = True
            break
    memo[chain.name] = result
    return result


def _ends_in_deny(ruleset: Ruleset, chain: Chain, seen: set[str]) -> bool:
    """Does traffic that matches no accepting rule end in DROP/REJECT inside this chain?"""
    return _default_verdict(ruleset, chain, seen) in _DENY


def _default_verdict(ruleset: Ruleset, chain: Chain, seen: set[str]) -> str | None:
    """The verdict of traffic matching only the chain's unconditional rules; None when it returns."""
    if chain.name in seen or len(seen) > _MAX_DEPTH:
        return None
    seen.add(chain.name)
    for rule in chain.rules:
        if not rule.unconditional or rule.target is None:
            continue
        if rule.target in _VERDICTS:
            return rule.target
        if rule.target == "RETURN":
            return None
        sub = ruleset.chain("filter", rule.target)
        # A jump into a chain that accepts everything ends the walk there: a DROP after it is never met.
        verdict = _default_verdict(ruleset, sub, seen) if sub is not None else None
        if verdict is not None:
            return verdict
        if rule.goto:
            return None
    return None
