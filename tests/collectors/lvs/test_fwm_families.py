"""An IPv4 and an IPv6 firewall-mark service with the same mark (``ipvsadm -A -f 1`` and ``-A -f 1 -6``) are two
services to the kernel. ipvsadm tells them apart (``FWM  1`` / ``FWM  1 IPv6``); /proc/net/ip_vs does not (its
FWM lines have no family), so the family comes from the real servers. Before, ServiceKey ignored the family:
the two collided, one service's counters overwrote the other's and one of them was never reported."""

from __future__ import annotations

import importlib.util
import ipaddress
from pathlib import Path

from opsloop.collectors.lvs import Config
from opsloop.collectors.lvs.collector import LvsCollector
from opsloop.lb.ipvs import ServiceKey, parse_ipvsadm, parse_ipvsadm_list, parse_proc_ip_vs
from tests.helpers import REPO

TESTDATA = REPO / "collectors" / "lvs" / "testdata"
_spec = importlib.util.spec_from_file_location("render_ipvsadm", TESTDATA / "render_ipvsadm.py")
assert _spec is not None and _spec.loader is not None
render_ipvsadm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_ipvsadm)

V4 = [("10.0.0.2:0", "Route", [1200, 12000, 0, 1_200_000, 0]), ("10.0.0.3:0", "Route", [800, 8000, 0, 800_000, 0])]
V6 = [("[2001:db8::2]:0", "Route", [30, 300, 0, 30_000, 0]), ("[2001:db8::3]:0", "Route", [70, 700, 0, 70_000, 0])]


def _proc_real(name: str, forward: str) -> str:
    """ip_vs_ctl.c ip_vs_info_seq_show(): ``  -> %08X:%04X      %-7s %-6d %-10d %-10d`` ([%pI6] for IPv6)."""
    host, _, port = name.rpartition(":")
    addr = ipaddress.ip_address(host.strip("[]"))
    shown = f"[{addr.exploded}]" if addr.version == 6 else f"{int(addr):08X}"
    return f"  -> {shown}:{int(port):04X}      {forward:<7} {100:<6d} {5:<10d} {1:<10d}"


def proc_text(services: list[tuple[int, list[tuple[str, str, list[int]]]]]) -> str:
    """/proc/net/ip_vs: ``FWM  %08X %s %s`` (mark, scheduler, "ops " or nothing) and no family."""
    lines = ["IP Virtual Server version 1.2.1 (size=4096)", "Prot LocalAddress:Port Scheduler Flags",
             "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn"]
    for mark, reals in services:
        lines.append(f"FWM  {mark:08X} wlc ")
        lines.extend(_proc_real(name, fwd) for name, fwd, _ in reals)
    return "\n".join(lines) + "\n"


def ipvsadm_stats(services: list[tuple[str, list[tuple[str, str, list[int]]]]]) -> str:
    """``ipvsadm -Ln --stats --exact``, ipvsadm 1.31's layout (sorted: IPv4 before IPv6 of one mark)."""
    rows = [(name, [sum(c) for c in zip(*(v for _, _, v in reals))] if reals else [0] * 5,
             [(r, v) for r, _, v in reals]) for name, reals in services]
    return render_ipvsadm.render(rows, "stats", exact=True)


def test_ipv4_and_ipv6_fwm_with_one_mark_are_two_services(tmp_path: Path) -> None:
    # the kernel lists the later one first in its fwmark bucket; ipvsadm sorts by mark, then family
    proc = tmp_path / "ip_vs"
    proc.write_text(proc_text([(1, V6), (1, V4)]))
    stats = tmp_path / "stats.txt"
    stats.write_text(ipvsadm_stats([("FWM  1", V4), ("FWM  1 IPv6", V6)]))
    assert [s.key for s in parse_proc_ip_vs(proc.read_text())] == [
        ServiceKey("fwm", fwmark=1, family="inet6"), ServiceKey("fwm", fwmark=1, family="inet")]
    # the join of both sources: every (service, real) of /proc is in ipvsadm's listing, and back
    proc_keys = {(s.key, r.key) for s in parse_proc_ip_vs(proc.read_text()) for r in s.reals}
    assert {(r.service, r.real) for r in parse_ipvsadm(stats.read_text()).rows if r.real} == proc_keys

    cfg = Config.model_validate({"host": "edge-ams-1", "proc_ip_vs": str(proc), "proc_ip_vs_stats": None,
                                 "ipvsadm_stats_command": ["cat", str(stats)], "ipvsadm_rate_command": None})
    rnd = LvsCollector(cfg).collect()
    assert rnd.errors == []
    services = {m.tags["address_family"]: m for m in rnd.metrics if m.name == "ipvs_virtual_server"}
    assert set(services) == {"inet", "inet6"}   # before: one of them, with the other's counters
    v4, v6 = services["inet"], services["inet6"]
    assert (v4.tags["service"], v4.tags["fwmark"], v4.tags["sched"]) == ("fwm:1", "1", "wlc")
    assert (v6.tags["service"], v6.tags["fwmark"], v6.tags["sched"]) == ("fwm6:1", "1", "wlc")
    assert (v4.fields["connections"], v4.fields["real_servers"]) == (2000, 2)   # ipvsadm's and /proc's, joined
    assert (v6.fields["connections"], v6.fields["real_servers"]) == (100, 2)
    reals = [m for m in rnd.metrics if m.name == "ipvs_real_server"]
    assert len(reals) == 4 and all({"weight", "connections"} <= set(m.fields) for m in reals)
    assert {m.tags["service"] for m in reals if m.tags["address_family"] == "inet6"} == {"fwm6:1"}


def test_a_family_the_reals_do_not_show_is_told_by_the_other_service_of_the_mark() -> None:
    # mark 2: the IPv6 service has no real server yet; mark 3: it tunnels to IPv4 reals (kernel >= 3.18 allows
    # other families for tunnelled reals only), beside an IPv4 service whose reals are routed
    services = parse_proc_ip_vs(proc_text([(2, []), (2, [("10.0.0.5:0", "Tunnel", [0] * 5)]),
                                           (3, [("10.0.0.7:0", "Tunnel", [0] * 5)]),
                                           (3, [("10.0.0.8:0", "Route", [0] * 5)])]))
    assert [(s.key.fwmark, s.key.family) for s in services] == [(2, "inet6"), (2, "inet"), (3, "inet6"), (3, "inet")]
    # one service of a mark: its reals' family, or IPv4 (the common case) when nothing shows one
    assert [s.key.family for s in parse_proc_ip_vs(proc_text([(4, []), (5, V6)]))] == ["inet", "inet6"]


def test_ipvsadm_plain_listing_reads_the_ipv6_word_of_a_fwm_service() -> None:
    # ipvsadm.c print_service_entry(): "FWM  %d IPv6" then the scheduler; before, "IPv6" was read as the scheduler
    text = ("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n"
            "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n"
            "FWM  1 wlc\n  -> 10.0.0.2:0                    Route   100    5          1\n"
            "FWM  1 IPv6 sh\n  -> [2001:db8::2]:0               Route   100    5          1\n")
    svcs = parse_ipvsadm_list(text)
    assert [(s.key, s.scheduler) for s in svcs] == [(ServiceKey("fwm", fwmark=1), "wlc"),
                                                    (ServiceKey("fwm", fwmark=1, family="inet6"), "sh")]
    assert [s.key.label for s in svcs] == ["fwm:1", "fwm6:1"]
