"""Render `ipvsadm -Ln --stats|--rate [--exact]` text exactly as ipvsadm 1.31 prints it.

This kernel has no IPVS, so ipvsadm cannot list anything here. The layout below follows
ipvsadm.c (print_title, print_service_entry, print_largenum): service name "%-33s", numbers
"%9llu" (or "%*llu" sized to the value with --exact, "%8lluK/M/G/T" abbreviated without it),
real servers "  -> %-28s", rate columns CPS/InPPS/OutPPS "%8u" for real servers.
Run: python render_ipvsadm.py  (rewrites the ipvsadm_*.txt fixtures of this folder).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent


def largenum(i: int, exact: bool) -> str:
    if exact:
        return f"{i:{9 if len(str(i)) <= 8 else len(str(i)) + 1}d}"
    for limit, div, suffix in ((10**8, 1, ""), (10**9, 10**3, "K"), (10**11, 10**6, "M"), (10**14, 10**9, "G")):
        if i < limit:
            return f"{i // div:9d}" if not suffix else f"{i // div:8d}{suffix}"
    return f"{i // 10**12:8d}T"


def render(services: list[tuple[str, list[int], list[tuple[str, list[int]]]]], kind: str, exact: bool) -> str:
    cols = ("Conns", "InPkts", "OutPkts", "InBytes", "OutBytes") if kind == "stats" else \
        ("CPS", "InPPS", "OutPPS", "InBPS", "OutBPS")
    out = ["IP Virtual Server version 1.2.1 (size=4096)",
           f"{'Prot LocalAddress:Port':<33} " + " ".join(f"{c:>8}" for c in cols),
           "  -> RemoteAddress:Port"]
    for name, values, reals in services:
        out.append(f"{name:<33}" + "".join(largenum(v, exact) for v in values))
        for rname, rv in reals:
            if kind == "rate":
                out.append(f"  -> {rname:<28} {rv[0]:8d} {rv[1]:8d} {rv[2]:8d}" + largenum(rv[3], exact) + largenum(rv[4], exact))
            else:
                out.append(f"  -> {rname:<28}" + "".join(largenum(v, exact) for v in rv))
    return "\n".join(out) + "\n"


def _sum(reals):
    return [sum(col) for col in zip(*(v for _, v in reals))]


def edge_services(t: int) -> list:
    """The services of proc_net_ip_vs.txt (node_exporter fixture); counters at round t (0, 1, 2)."""
    grow = [0, 15, 30][t]
    mysql1 = [("192.168.82.22:3306", [4_101_337 + 40 * grow, 983_554_101 + 9_000 * grow, 0, 4_294_000_000 + 1_200_000 * grow, 0]),
              ("192.168.83.21:3306", [4_099_812 + 38 * grow, 981_203_779 + 8_800 * grow, 0, 88_120_554_810 + 1_150_000 * grow, 0]),
              ("192.168.83.24:3306", [4_100_901 + 41 * grow, 982_771_050 + 9_100 * grow, 0, 88_201_337_902 + 1_210_000 * grow, 0])]
    mysql2 = [("192.168.50.21:3306", [120_553 + 9 * grow, 30_778_410 + 2_000 * grow, 0, 2_811_097_654 + 300_000 * grow, 0]),
              ("192.168.82.21:3306", [120_901 + 10 * grow, 30_802_119 + 2_100 * grow, 0, 2_815_220_109 + 310_000 * grow, 0]),
              ("192.168.84.22:3306", [0, 0, 0, 0, 0])]
    mysql3 = [("192.168.49.32:3306", [77 + grow // 15, 12_004, 0, 1_100_455, 0]),
              ("192.168.50.26:3306", [0, 0, 0, 0, 0])]
    web6 = [("[2620::2]:80", [1_002, 10_221, 9_877, 1_022_100, 12_877_301]),
            ("[2620::3]:80", [998, 10_117, 9_804, 1_011_700, 12_790_112]),
            ("[2620::4]:80", [1_004 + grow, 10_301 + 11 * grow, 9_911 + 10 * grow, 1_030_100 + 1_100 * grow, 12_901_004 + 13_000 * grow])]
    fwm = [("192.168.50.21:3306", [50_001 + 2 * grow, 500_017 + 20 * grow, 0, 51_001_734 + 2_000 * grow, 0]),
           ("192.168.50.26:3306", [49_877 + 2 * grow, 498_770 + 20 * grow, 0, 50_877_003 + 2_000 * grow, 0])]
    return [("TCP  192.168.0.22:3306", _sum(mysql1), mysql1), ("TCP  192.168.0.55:3306", _sum(mysql3), mysql3),
            ("TCP  192.168.0.57:3306", _sum(mysql2), mysql2), ("TCP  [2620::1]:80", _sum(web6), web6),
            ("FWM  268439552", _sum(fwm), fwm)]


def edge_rates() -> list:
    mysql1 = [("192.168.82.22:3306", [3, 600, 0, 80_000, 0]), ("192.168.83.21:3306", [2, 587, 0, 76_667, 0]),
              ("192.168.83.24:3306", [3, 607, 0, 80_667, 0])]
    empty = [("192.168.50.21:3306", [0, 0, 0, 0, 0])]
    return [("TCP  192.168.0.22:3306", _sum(mysql1), mysql1), ("TCP  192.168.0.57:3306", [0, 0, 0, 0, 0], empty)]


if __name__ == "__main__":
    for t in (0, 1, 2):
        (HERE / f"ipvsadm_stats_exact.t{t}.txt").write_text(render(edge_services(t), "stats", exact=True))
    (HERE / "ipvsadm_rate_exact.txt").write_text(render(edge_rates(), "rate", exact=True))
    (HERE / "ipvsadm_stats_abbreviated.txt").write_text(render(edge_services(0), "stats", exact=False))
