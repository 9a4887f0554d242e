"""Ruleset fingerprints: what changed, and whether two hypervisors are configured alike.

``fingerprint`` hashes the whole normalized ruleset (no counters, no comments, no
``# Generated`` timestamps; tables and chain declarations in sorted order so that the nft and
legacy backends and chain creation order do not matter; rule order inside a chain kept, as it
is semantic).

``base_fingerprint`` leaves out everything that belongs to one VM port: its per-port chains
(``<prefix>-i<id>``, ``-o<id>``, ``-s<id>``), rules that jump to them and rules that match a
tap/qvb device. Two hypervisors with the same software and configuration therefore share a
base fingerprint whatever VMs they run, and a host whose base differs has drifted.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from opsloop.collectors.iptables.parse import Rule, Ruleset

_VM_DEVICE = re.compile(r"^(tap|qvb|qvo|qbr)[0-9a-f]")


def port_chain_pattern(chain_prefix: str) -> re.Pattern[str]:
    # Neutron names per-port chains prefix + direction letter + port_id[:10].
    return re.compile(rf"^{re.escape(chain_prefix)}-[ios][0-9a-f]{{8}}-[0-9a-f]$")


def normalized_lines(rulesets: Iterable[tuple[str, Ruleset]], exclude_port_state: str | None = None) -> list[str]:
    """Canonical text of one or more (backend, ruleset) pairs; with a chain prefix, without VM ports."""
    port_chain = port_chain_pattern(exclude_port_state) if exclude_port_state else None
    lines: list[str] = []
    for backend, ruleset in sorted(rulesets, key=lambda br: br[0]):
        lines.append(f"@{backend}")
        for tname in sorted(ruleset.tables):
            table = ruleset.tables[tname]
            lines.append(f"*{tname}")
            chains = sorted(table.chains.values(), key=lambda c: c.name)
            for chain in chains:
                if port_chain and port_chain.match(chain.name):
                    continue
                lines.append(f":{chain.name} {chain.policy or '-'}")
            for chain in chains:
                if port_chain and port_chain.match(chain.name):
                    continue
                for rule in chain.rules:
                    if port_chain and _is_port_rule(rule, port_chain):
                        continue
                    lines.append(rule.normalized)
            lines.append("COMMIT")
    return lines


def fingerprint(rulesets: Iterable[tuple[str, Ruleset]], exclude_ports_with_prefix: str | None = None) -> str:
    text = "\n".join(normalized_lines(list(rulesets), exclude_ports_with_prefix)) + "\n"
    return hashlib.sha256(text.encode()).hexdigest()


def _is_port_rule(rule: Rule, port_chain: re.Pattern[str]) -> bool:
    if rule.target and port_chain.match(rule.target):
        return True
    return any(m is not None and _VM_DEVICE.match(m.name) for m in (rule.physdev_in, rule.physdev_out))
