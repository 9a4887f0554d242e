"""Neutron's iptables firewall layout as ``iptables-restore`` input.

What the OVS-hybrid (``neutron-openvswi``) or linuxbridge (``neutron-linuxbri``) agent's
iptables firewall driver installs in the filter table for a set of ports; modelled on
``iptables-save`` output of real compute nodes. Used to build test "hypervisors" in network
namespaces and to document what :mod:`opsloop.collectors.iptables.analyze` expects. Rules that need
state outside iptables (ipset ``--match-set``) are left out so that it restores anywhere.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from opsloop.collectors.iptables.analyze import default_device, port_chains


@dataclass(frozen=True, slots=True)
class LayoutPort:
    port_id: str
    ip: str
    mac: str
    allow_tcp: tuple[int, ...] = (22,)

    @property
    def ip6(self) -> str:
        """A global address (fd00:9::/64) and the link-local one, both from the MAC (EUI-64)."""
        return _eui64("fd00:9::/64", self.mac)

    @property
    def link_local(self) -> str:
        return _eui64("fe80::/64", self.mac)


def _eui64(prefix: str, mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    b[0] ^= 0x02   # the universal/local bit flips in an EUI-64 interface id
    iid = int.from_bytes(bytes(b[:3] + [0xFF, 0xFE] + b[3:]), "big")
    return str(ipaddress.IPv6Address(int(ipaddress.IPv6Network(prefix).network_address) | iid))


def filter_table(ports: list[LayoutPort], prefix: str = "neutron-openvswi", host_rules: tuple[str, ...] = (),
                 family: str = "ipv4") -> str:
    """The ``*filter`` table for these ports, for ``iptables-restore`` (ipv4) or ``ip6tables-restore``
    (ipv6: Neutron's ICMPv6/DHCPv6 rules). ``host_rules`` are extra ``-A ...`` lines (drift)."""
    if family not in ("ipv4", "ipv6"):
        raise ValueError(f"family {family!r}: expected ipv4 or ipv6")
    p = prefix
    chains = ["neutron-filter-top", f"{p}-FORWARD", f"{p}-INPUT", f"{p}-OUTPUT", f"{p}-local",
              f"{p}-sg-chain", f"{p}-sg-fallback"]
    for port in ports:
        c = port_chains(p, port.port_id)
        chains += [c.ingress, c.egress, c.spoof]
    lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
    lines += [f":{name} - [0:0]" for name in sorted(chains)]
    lines += [f"-A INPUT -j {p}-INPUT", "-A FORWARD -j neutron-filter-top", f"-A FORWARD -j {p}-FORWARD",
              "-A OUTPUT -j neutron-filter-top", f"-A OUTPUT -j {p}-OUTPUT",
              f"-A neutron-filter-top -j {p}-local"]
    lines += list(host_rules)
    to_sg = '-m comment --comment "Direct traffic from the VM interface to the security group chain."'
    to_vm = '-m comment --comment "Jump to the VM specific chain."'
    for port in ports:
        tap, c = default_device(port.port_id), port_chains(p, port.port_id)
        lines += [
            f"-A {p}-FORWARD -m physdev --physdev-out {tap} --physdev-is-bridged {to_sg} -j {p}-sg-chain",
            f"-A {p}-FORWARD -m physdev --physdev-in {tap} --physdev-is-bridged {to_sg} -j {p}-sg-chain",
            f"-A {p}-INPUT -m physdev --physdev-in {tap} --physdev-is-bridged "
            f'-m comment --comment "Direct incoming traffic from VM to the security group chain." -j {c.egress}',
            f"-A {p}-sg-chain -m physdev --physdev-out {tap} --physdev-is-bridged {to_vm} -j {c.ingress}",
            f"-A {p}-sg-chain -m physdev --physdev-in {tap} --physdev-is-bridged {to_vm} -j {c.egress}",
        ]
        if family == "ipv4":
            lines += [f"-A {c.ingress} -m state --state RELATED,ESTABLISHED -j RETURN",
                      f"-A {c.ingress} -s 10.0.0.2/32 -p udp -m udp --sport 67 --dport 68 -j RETURN"]
        else:
            lines += [f"-A {c.ingress} -m state --state RELATED,ESTABLISHED -j RETURN"]
            lines += [f"-A {c.ingress} -p ipv6-icmp -m icmp6 --icmpv6-type {t} -j RETURN" for t in (130, 134, 135, 136)]
            lines += [f"-A {c.ingress} -s fe80::/64 -p udp -m udp --sport 547 --dport 546 -j RETURN"]
        lines += [f"-A {c.ingress} -p tcp -m tcp --dport {port_no} -j RETURN" for port_no in port.allow_tcp]
        lines += [f"-A {c.ingress} -m state --state INVALID -j DROP",
                  f"-A {c.ingress} -j {p}-sg-fallback"]
        if family == "ipv4":
            lines += [f"-A {c.egress} -s 0.0.0.0/32 -d 255.255.255.255/32 -p udp -m udp --sport 68 --dport 67 -j RETURN",
                      f"-A {c.egress} -j {c.spoof}",
                      f"-A {c.egress} -p udp -m udp --sport 67 --dport 68 -j DROP"]
            spoof = [f"-A {c.spoof} -s {port.ip}/32 -m mac --mac-source {port.mac} -j RETURN"]
        else:
            lines += [f"-A {c.egress} -s ::/128 -d ff02::/16 -p ipv6-icmp -m icmp6 --icmpv6-type {t} -j RETURN"
                      for t in (131, 135, 143)]
            lines += [f"-A {c.egress} -j {c.spoof}",
                      f"-A {c.egress} -p ipv6-icmp -m icmp6 --icmpv6-type 134 -j DROP",   # no router adverts from VMs
                      f"-A {c.egress} -p udp -m udp --sport 547 --dport 546 -j DROP"]
            spoof = [f"-A {c.spoof} -s {port.ip6}/128 -m mac --mac-source {port.mac} -j RETURN",
                     f"-A {c.spoof} -s {port.link_local}/128 -m mac --mac-source {port.mac} -j RETURN"]
        lines += [f"-A {c.egress} -m state --state RELATED,ESTABLISHED -j RETURN",
                  f"-A {c.egress} -j RETURN"]
        lines += [*spoof, f"-A {c.spoof} -j DROP"]
    lines += [f"-A {p}-sg-chain -j ACCEPT",
              f'-A {p}-sg-fallback -m comment --comment "Default drop rule for unmatched traffic." -j DROP',
              "COMMIT", ""]
    return "\n".join(lines)
