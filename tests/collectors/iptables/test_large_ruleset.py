"""A hypervisor with hundreds of VM ports: the per-port verdict must not walk every other port's rules.

Neutron's FORWARD and sg-chain hold two rules per port, and the analysis walked (and evaluated the physdev
match of) all of them for every port: quadratic in ports, 54 s for 1000 ports (17k rules) per family, with no
bound in the round. The work is counted here (calls of the physdev test per port), not timed.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from opsloop.collectors.iptables import analyze
from opsloop.collectors.iptables.analyze import analyze_port, default_device, port_chains
from opsloop.collectors.iptables.neutron_layout import LayoutPort, filter_table
from opsloop.collectors.iptables.parse import Ruleset, parse_ruleset

pytestmark = pytest.mark.integration
PREFIX = "neutron-openvswi"


def _sh(*argv: str, stdin: str | None = None) -> str:
    res = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"{argv} failed: {res.stderr}")
    return res.stdout


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"opsl-big-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    _sh("ip", "netns", "add", name)
    try:
        yield name
    finally:
        _sh("ip", "netns", "delete", name)


def _ports(n: int) -> list[LayoutPort]:
    return [LayoutPort(str(uuid.uuid4()), f"10.1.{i // 256}.{i % 256}", f"fa:16:3e:01:{i // 256:02x}:{i % 256:02x}")
            for i in range(n)]


def _restored(netns: str, text: str) -> Ruleset:
    """The ruleset as the kernel holds it and iptables-nft-save prints it."""
    _sh("ip", "netns", "exec", netns, "iptables-nft-restore", stdin=text)
    return parse_ruleset(_sh("ip", "netns", "exec", netns, "iptables-nft-save"))


def _physdev_tests_per_port(monkeypatch: pytest.MonkeyPatch, ruleset: Ruleset, ports: list[LayoutPort]
                            ) -> tuple[float, dict[str, str]]:
    calls = 0
    real = analyze._applies

    def counting(*args: object) -> bool:
        nonlocal calls
        calls += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(analyze, "_applies", counting)
    reasons = {p.port_id: analyze_port(ruleset, PREFIX, p.port_id, default_device(p.port_id)).reason for p in ports}
    monkeypatch.setattr(analyze, "_applies", real)
    return calls / len(ports), reasons


def test_work_per_port_does_not_grow_with_the_ports(netns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    small, large = _ports(20), _ports(400)
    per_port_small, reasons_small = _physdev_tests_per_port(monkeypatch, _restored(netns, filter_table(small)), small)
    ruleset = _restored(netns, filter_table(large))
    assert ruleset.rule_count > 6800
    per_port_large, reasons_large = _physdev_tests_per_port(monkeypatch, ruleset, large)
    assert set(reasons_small.values()) == set(reasons_large.values()) == {""}   # every port protected
    # was ~5900 per port at 400 ports and ~330 at 20 (every rule of FORWARD and sg-chain, several times)
    assert per_port_large == per_port_small < 30


def test_one_lost_jump_among_many_ports_is_still_found(netns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = _ports(300)
    victim = ports[150]
    tap, chains = default_device(victim.port_id), port_chains(PREFIX, victim.port_id)
    lost = f"-A {PREFIX}-sg-chain -m physdev --physdev-in {tap} --physdev-is-bridged"
    text = "\n".join(ln for ln in filter_table(ports).splitlines() if not ln.startswith(lost))
    _, reasons = _physdev_tests_per_port(monkeypatch, _restored(netns, text), ports)
    assert reasons.pop(victim.port_id) == f"no jump to {chains.egress} for traffic from {tap} on the FORWARD path"
    assert set(reasons.values()) == {""}
