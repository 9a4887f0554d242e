"""Parsers for LVS state: ``/proc/net/ip_vs``, ``/proc/net/ip_vs_stats`` and ``ipvsadm -Ln`` listings.

Formats, from the kernel's ip_vs_ctl.c and ipvsadm.c:

* ``/proc/net/ip_vs`` (hex addresses and ports)::

      TCP  C0A80016:0CEA wlc [ops ][persistent 300 FFFFFFFF]
        -> C0A85216:0CEA      Tunnel  100    248        2
      TCP  [2620:0000:...:0001]:0050 sh
      FWM  10001000 wlc

* ``/proc/net/ip_vs_stats``: totals (conns/packets ``%8X``, 32-bit on older kernels; bytes
  ``%16LX``), blank line, then the kernel's rate estimates, all hex.
* ``ipvsadm -Ln --stats --exact`` / ``--rate --exact``: decimal, one line per service and per
  real server. ipvsadm prints ``--stats`` *or* ``--rate`` columns (with both flags, stats win), so
  the header decides which columns these are. Without ``--exact`` large numbers are abbreviated
  (``2110M``); those are refused because a rate computed from them would be wrong.

Every parser raises :class:`LvsParseError` (naming the line) for anything it does not understand.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Callable, Literal

STAT_FIELDS = ("connections", "pkts_in", "pkts_out", "bytes_in", "bytes_out")
RATE_FIELDS = ("cps", "pps_in", "pps_out", "bps_in", "bps_out")
_PROTOCOLS = ("TCP", "UDP", "SCTP")
_HEX = re.compile(r"^[0-9A-Fa-f]+$")
_DEC = re.compile(r"^\d+$")
_ABBREV = re.compile(r"^\d+[KMGT]$")


class LvsParseError(ValueError):
    def __init__(self, source: str, line_no: int, line: str, reason: str) -> None:
        shown = line if len(line) <= 120 else line[:117] + "..."
        super().__init__(f"{source} line {line_no}: {reason}: {shown!r}")


@dataclass(frozen=True, slots=True)
class ServiceKey:
    """A virtual service: protocol + address + port, or a firewall mark."""

    protocol: str  # "tcp", "udp", "sctp" or "fwm"
    address: str = ""
    port: int = 0
    fwmark: int = 0
    # compared: the kernel keys a firewall-mark service by (family, mark), so FWM 1 and FWM 1 IPv6 are two
    # services. /proc's FWM lines do not show it: parse_proc_ip_vs infers it from the real servers.
    family: str = "inet"

    @property
    def label(self) -> str:
        if self.protocol == "fwm":
            return f"fwm6:{self.fwmark}" if self.family == "inet6" else f"fwm:{self.fwmark}"
        host = f"[{self.address}]" if self.family == "inet6" else self.address
        return f"{self.protocol}:{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class RealKey:
    address: str
    port: int
    family: str = "inet"


@dataclass(slots=True)
class RealServer:
    key: RealKey
    forward: str   # Masq/Route/Tunnel/Local; in a --thresholds listing the upper threshold (its column)
    weight: int    # in a --thresholds listing the lower threshold
    active: int
    inactive: int
    tunnel: str | None = None   # the TunnelInfo column of a --tun-info listing (ipip, gue:PORT:FLAGS, n/a)


@dataclass(slots=True)
class Service:
    key: ServiceKey
    scheduler: str
    # as /proc/net/ip_vs prints it: kernel ticks (svc->timeout, set to seconds * HZ), not seconds; HZ (100..1000)
    # is not visible from user space. None: not persistent.
    persistent_timeout: int | None = None
    one_packet: bool = False
    reals: list[RealServer] = field(default_factory=list)


@dataclass(slots=True)
class CounterRow:
    """One line of an ipvsadm --stats/--rate listing (a service, or a real server of ``service``)."""

    service: ServiceKey
    real: RealKey | None
    values: dict[str, int]


@dataclass(slots=True)
class IpvsadmListing:
    kind: Literal["stats", "rate"]
    rows: list[CounterRow] = field(default_factory=list)


# -- /proc/net/ip_vs -----------------------------------------------------------------------------

def parse_proc_ip_vs(text: str, source: str = "/proc/net/ip_vs") -> list[Service]:
    return _parse_service_listing(text, source, _hex_addr_port, mark_base=16, with_flags=True)


def parse_ipvsadm_list(text: str, source: str = "ipvsadm -Ln") -> list[Service]:
    """The plain ``ipvsadm -Ln [--exact]`` listing (weights, not counters): /proc's layout in decimal.

    ipvsadm.c ``print_title``/``print_service_entry``::

        IP Virtual Server version 1.2.1 (size=4096)
        Prot LocalAddress:Port Scheduler Flags
          -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
        TCP  192.168.0.22:3306 wlc persistent 300
          -> 192.168.82.22:3306           Route   100    248        2
        FWM  268439552 wlc
        TCP  10.0.0.1:0 rr persistent 300          (an all-port service: persistent, port 0)
          -> 10.0.0.2:0                   Route   1      0          0

    The headers tell the layout, read from them: ``--tun-info`` adds a ``TunnelInfo`` column after
    ``Forward`` (kept in :attr:`RealServer.tunnel`; a line already without it is read as before);
    ``--thresholds`` has ``Uthreshold Lthreshold`` where ``Forward Weight`` stand (read into those
    slots). ``--persistent-conn``, ``--stats`` and ``--rate`` listings (other columns in the same
    places: a weight read from them would be another number) are refused in one line.
    """
    return _parse_service_listing(text, source, _dec_addr_port, mark_base=10, with_flags=False)


_FORWARDS = frozenset({"Masq", "Route", "Tunnel", "Local"})   # ip_vs_fwd_name / ipvsadm fwd_name
# ipvsadm.c print_title: the first column after "Prot LocalAddress:Port" names the layout
_REFUSED_LAYOUTS = {"Weight": "--persistent-conn", "Conns": "--stats", "CPS": "--rate"}


def _listing_layout(line: str, layout: str, source: str, line_no: int, raw: str) -> str:
    """The layout a header line of ``ipvsadm -Ln`` announces ("plain", "thresholds", "tun-info"), else the one
    so far; a layout whose columns would be misread raises."""
    cols = line.split()
    if cols[:2] == ["Prot", "LocalAddress:Port"]:
        first = cols[2] if len(cols) > 2 else ""
        if first in _REFUSED_LAYOUTS:
            raise LvsParseError(source, line_no, raw, f"an ipvsadm -Ln {_REFUSED_LAYOUTS[first]} listing, not the "
                                                      "plain one (run ipvsadm -Ln [--exact|--thresholds|--tun-info])")
        if first == "Uthreshold":
            return "thresholds"
        if first != "Scheduler":
            raise LvsParseError(source, line_no, raw, "unknown ipvsadm -Ln header")
        return "plain"
    if "TunnelInfo" in cols:   # "-> RemoteAddress:Port Forward TunnelInfo Weight ..."
        return "tun-info"
    return layout


AddrPort = Callable[[str, str, int, str], tuple[str, int, str]]


def _parse_service_listing(text: str, source: str, addr_port: AddrPort, mark_base: int,
                           with_flags: bool) -> list[Service]:
    """Services and their real servers; /proc/net/ip_vs (hex) and ``ipvsadm -Ln`` (decimal) share it."""
    services: list[Service] = []
    lines = text.splitlines()
    if not lines or not lines[0].startswith("IP Virtual Server version"):
        raise LvsParseError(source, 1, lines[0] if lines else "", "missing 'IP Virtual Server version' header")
    layout = "plain"
    for line_no, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("Prot ") or line.startswith("-> RemoteAddress"):
            if not with_flags:   # /proc has one layout; ipvsadm's headers tell which of its columns these are
                layout = _listing_layout(line, layout, source, line_no, raw)
            continue
        parts = line.split()
        if parts[0] == "->":
            if not services:
                raise LvsParseError(source, line_no, raw, "real server before any service")
            tunnel = None
            if layout == "tun-info" and len(parts) == 7:
                tunnel = parts.pop(3)
            if len(parts) != 6:
                raise LvsParseError(source, line_no, raw, "real server line needs address, forward, weight, "
                                                          "active and inactive connections"
                                                          + (", and TunnelInfo" if layout == "tun-info" else ""))
            if layout == "plain" and parts[2] not in _FORWARDS:
                raise LvsParseError(source, line_no, raw, f"forward method {parts[2]!r} is none of "
                                                          f"{', '.join(sorted(_FORWARDS))} (another listing?)")
            address, port, family = addr_port(parts[1], source, line_no, raw)
            weight, active, inactive = (_int(p, 10, source, line_no, raw) for p in parts[3:6])
            services[-1].reals.append(RealServer(RealKey(address, port, family), parts[2], weight, active, inactive,
                                                 tunnel))
        elif parts[0] in _PROTOCOLS or parts[0] == "FWM":
            if len(parts) < 3:
                raise LvsParseError(source, line_no, raw, "service line needs address and scheduler")
            if parts[0] == "FWM":
                family = "inet"
                if not with_flags and parts[2] == "IPv6":   # ipvsadm: "FWM  1 IPv6 wlc"; /proc shows no family
                    parts, family = parts[:2] + parts[3:], "inet6"
                    if len(parts) < 3:
                        raise LvsParseError(source, line_no, raw, "service line needs a scheduler")
                key = ServiceKey("fwm", fwmark=_int(parts[1], mark_base, source, line_no, raw), family=family)
            else:
                address, port, family = addr_port(parts[1], source, line_no, raw)
                key = ServiceKey(parts[0].lower(), address, port, family=family)
            svc = Service(key, parts[2])
            if with_flags:   # ipvsadm words its flags differently; the actuator does not need them
                _service_flags(svc, parts[3:], source, line_no, raw)
            services.append(svc)
        else:
            raise LvsParseError(source, line_no, raw, "neither a service nor a real server line")
    if with_flags:
        _infer_fwm_families(services)
    return services


def _fwm_family(reals: list[RealServer]) -> tuple[str, int]:
    """The family of a /proc FWM service and how sure it is: 2 from a real server not tunnelled (the kernel
    refuses any other forwarding across families), 1 from tunnelled ones all of one family, 0 none (inet)."""
    direct = {r.key.family for r in reals if r.forward != "Tunnel"}
    if len(direct) == 1:
        return direct.pop(), 2
    families = {r.key.family for r in reals}
    if not direct and len(families) == 1:
        return families.pop(), 1
    return "inet", 0


def _infer_fwm_families(services: list[Service]) -> None:
    """Give /proc's FWM services their family, so that they join ipvsadm's (``FWM  1`` / ``FWM  1 IPv6``)
    and an IPv4 and an IPv6 service of one mark stay two. A mark listed twice is one service of each
    family: when both read alike, the less sure one is the other family."""
    by_mark: dict[int, list[tuple[int, int]]] = {}
    for i, svc in enumerate(services):
        if svc.key.protocol == "fwm":
            family, sure = _fwm_family(svc.reals)
            svc.key = ServiceKey("fwm", fwmark=svc.key.fwmark, family=family)
            by_mark.setdefault(svc.key.fwmark, []).append((sure, i))
    for pair in by_mark.values():
        if len(pair) != 2:   # the kernel has at most one of each family
            continue
        (sure_a, a), (sure_b, b) = pair
        if services[a].key == services[b].key and sure_a != sure_b:   # equally unsure: nothing tells them apart
            flip = services[a] if sure_a < sure_b else services[b]
            other = "inet" if flip.key.family == "inet6" else "inet6"
            flip.key = ServiceKey("fwm", fwmark=flip.key.fwmark, family=other)


def _service_flags(svc: Service, flags: list[str], source: str, line_no: int, raw: str) -> None:
    i = 0
    while i < len(flags):
        if flags[i] == "ops":
            svc.one_packet = True
            i += 1
        elif flags[i] == "persistent" and i + 2 < len(flags):
            svc.persistent_timeout = _int(flags[i + 1], 10, source, line_no, raw)
            _int(flags[i + 2], 16, source, line_no, raw)  # netmask: validated, not reported
            i += 3
        else:
            raise LvsParseError(source, line_no, raw, f"unknown service flag {flags[i]!r}")


def _hex_addr_port(token: str, source: str, line_no: int, raw: str) -> tuple[str, int, str]:
    addr, sep, port = token.rpartition(":")
    if not sep or not _HEX.match(port) or len(port) > 4:
        raise LvsParseError(source, line_no, raw, f"bad address:port {token!r}")
    try:
        if addr.startswith("[") and addr.endswith("]"):
            return str(ipaddress.IPv6Address(addr[1:-1])), int(port, 16), "inet6"
        if len(addr) == 8 and _HEX.match(addr):
            return str(ipaddress.IPv4Address(int(addr, 16))), int(port, 16), "inet"
    except ValueError:
        pass
    raise LvsParseError(source, line_no, raw, f"bad address {addr!r}")


def _int(token: str, base: int, source: str, line_no: int, raw: str) -> int:
    pattern = _HEX if base == 16 else _DEC
    if not pattern.match(token) or len(token) > 20:
        raise LvsParseError(source, line_no, raw, f"{token!r} is not a base-{base} number")
    return int(token, base)


# -- /proc/net/ip_vs_stats -----------------------------------------------------------------------

def parse_proc_ip_vs_stats(text: str, source: str = "/proc/net/ip_vs_stats") -> dict[str, int]:
    """Totals and the kernel's rate estimates (fields of STAT_FIELDS and RATE_FIELDS)."""
    rows: list[tuple[int, str]] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        parts = raw.split()
        if parts and all(_HEX.match(p) for p in parts):
            rows.append((line_no, raw))
    if len(rows) != 2:
        raise LvsParseError(source, rows[-1][0] if rows else 1, rows[-1][1] if rows else text[:80],
                            f"expected 2 rows of 5 hex numbers (totals, rates), found {len(rows)}")
    out: dict[str, int] = {}
    for (line_no, raw), names in zip(rows, (STAT_FIELDS, RATE_FIELDS)):
        parts = raw.split()
        if len(parts) != 5:
            raise LvsParseError(source, line_no, raw, f"expected 5 hex numbers, found {len(parts)}")
        out.update({n: _int(p, 16, source, line_no, raw) for n, p in zip(names, parts)})
    return out


# -- ipvsadm -Ln --stats|--rate --exact ------------------------------------------------------------

def parse_ipvsadm(text: str, source: str = "ipvsadm") -> IpvsadmListing:
    kind: Literal["stats", "rate"] | None = None
    listing: IpvsadmListing | None = None
    service: ServiceKey | None = None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("IP Virtual Server version") or line == "-> RemoteAddress:Port":
            continue
        if line.startswith("Prot LocalAddress:Port"):
            cols = line.split()[2:]
            if cols[:1] == ["Conns"]:
                kind = "stats"
            elif cols[:1] == ["CPS"]:
                kind = "rate"
            else:
                raise LvsParseError(source, line_no, raw, "not a --stats or --rate listing (run ipvsadm -Ln "
                                                          "--stats --exact or -Ln --rate --exact)")
            listing = IpvsadmListing(kind)
            continue
        if listing is None:
            raise LvsParseError(source, line_no, raw, "data before the 'Prot LocalAddress:Port' header")
        parts = line.split()
        names = STAT_FIELDS if listing.kind == "stats" else RATE_FIELDS
        if parts[0] == "->":
            if service is None:
                raise LvsParseError(source, line_no, raw, "real server before any service")
            if len(parts) != 7:
                raise LvsParseError(source, line_no, raw, "real server line needs address and 5 numbers")
            address, port, family = _dec_addr_port(parts[1], source, line_no, raw)
            values = _counters(parts[2:], names, source, line_no, raw)
            listing.rows.append(CounterRow(service, RealKey(address, port, family), values))
        elif parts[0] == "FWM":
            rest = parts[2:]
            family = "inet"
            if rest[:1] == ["IPv6"]:
                rest, family = rest[1:], "inet6"
            if len(rest) != 5:
                raise LvsParseError(source, line_no, raw, "service line needs 5 numbers")
            service = ServiceKey("fwm", fwmark=_int(parts[1] if len(parts) > 1 else "", 10, source, line_no, raw),
                                 family=family)
            listing.rows.append(CounterRow(service, None, _counters(rest, names, source, line_no, raw)))
        elif parts[0] in _PROTOCOLS:
            if len(parts) != 7:
                raise LvsParseError(source, line_no, raw, "service line needs address and 5 numbers")
            address, port, family = _dec_addr_port(parts[1], source, line_no, raw)
            service = ServiceKey(parts[0].lower(), address, port, family=family)
            listing.rows.append(CounterRow(service, None, _counters(parts[2:], names, source, line_no, raw)))
        else:
            raise LvsParseError(source, line_no, raw, "neither a service nor a real server line")
    if listing is None:
        raise LvsParseError(source, 1, text[:80], "no 'Prot LocalAddress:Port' header (not ipvsadm -Ln output)")
    return listing


def _counters(tokens: list[str], names: tuple[str, ...], source: str, line_no: int, raw: str) -> dict[str, int]:
    for t in tokens:
        if _ABBREV.match(t):
            raise LvsParseError(source, line_no, raw, f"value {t!r} is abbreviated: run ipvsadm with --exact")
    return {n: _int(t, 10, source, line_no, raw) for n, t in zip(names, tokens)}


def _dec_addr_port(token: str, source: str, line_no: int, raw: str) -> tuple[str, int, str]:
    addr, sep, port = token.rpartition(":")
    if not sep or not _DEC.match(port) or int(port) > 65535:
        raise LvsParseError(source, line_no, raw, f"bad address:port {token!r} (numeric output needs -n)")
    try:
        if addr.startswith("[") and addr.endswith("]"):
            return str(ipaddress.IPv6Address(addr[1:-1])), int(port), "inet6"
        return str(ipaddress.IPv4Address(addr)), int(port), "inet"
    except ValueError:
        raise LvsParseError(source, line_no, raw, f"bad address {addr!r} (numeric output needs -n)") from None


# How an operator writes a virtual service and a real server in the config (``tcp:192.0.2.10:443``,
# ``fwm:7``; ``10.0.0.1:443``, ``[2001:db8::1]:443``): read by the actuator's config check and its pushes.
SPEC_PROTOCOLS = ("tcp", "udp", "sctp", "fwm")


def _addr_port(text: str, what: str, zero_port: bool = False) -> tuple[str, int, str]:
    host, sep, port_s = text.rpartition(":")
    if not sep or not (port_s.isascii() and port_s.isdigit()) or not (0 if zero_port else 1) <= int(port_s) < 65536:
        raise ValueError(f"{what} {text!r}: expected ADDRESS:PORT ([IPv6]:PORT)")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        addr = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        raise ValueError(f"{what} {text!r}: {host!r} is not an IP address") from None
    if addr.version == 6 and not bracketed:
        raise ValueError(f"{what} {text!r}: write IPv6 addresses in brackets, [{host}]:{port_s}")
    return str(addr), int(port_s), "inet6" if addr.version == 6 else "inet"


def parse_service_spec(spec: str) -> ServiceKey:
    """``tcp:VIP:PORT`` / ``udp:...`` / ``sctp:...`` / ``fwm:MARK`` -> ServiceKey. PORT 0 is an all-port service
    (``ipvsadm -A -t VIP:0 -p``, listed ``TCP  VIP:0 rr persistent 300``; ipvsadm takes port 0 for a persistent
    service only, and the listing tells whether there is one)."""
    proto, sep, rest = spec.partition(":")
    proto = proto.lower()
    if not sep or proto not in SPEC_PROTOCOLS:
        raise ValueError(f"virtual service {spec!r}: expected tcp:VIP:PORT, udp:VIP:PORT, sctp:VIP:PORT or fwm:MARK")
    if proto == "fwm":
        if not rest.isdigit() or int(rest) < 1:
            raise ValueError(f"virtual service {spec!r}: firewall mark must be a positive integer")
        return ServiceKey("fwm", fwmark=int(rest))
    address, port, family = _addr_port(rest, "virtual service", zero_port=True)
    return ServiceKey(proto, address, port, family=family)


def parse_real_spec(spec: str, service: ServiceKey | None = None) -> RealKey:
    """``ADDRESS:PORT`` / ``[IPv6]:PORT``; PORT 0 only for a real of ``service`` when that is a firewall-mark or an
    all-port service (ipvsadm gives a real without a port, or a direct-routed/tunnelled one, the service's port:
    listed ``:0``)."""
    zero = service is not None and (service.protocol == "fwm" or service.port == 0)
    address, port, family = _addr_port(spec, "real server", zero_port=zero)
    return RealKey(address, port, family)
