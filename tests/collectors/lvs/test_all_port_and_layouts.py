"""All-port persistent services (``ipvsadm -A -t VIP:0 -s rr -p 300``) and the column layouts of ``ipvsadm -Ln``
with --thresholds / --persistent-conn / --tun-info / --stats, in the layouts of ipvsadm 1.31's ipvsadm.c
(``print_title``, ``print_service_entry``) and the kernel's ``ip_vs_info_seq_show`` (ip_vs_ctl.c)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.collectors.lvs import Config
from opsloop.collectors.lvs.collector import LvsCollector
from opsloop.lb.ipvs import (LvsParseError, RealKey, ServiceKey, parse_ipvsadm, parse_ipvsadm_list, parse_proc_ip_vs,
                             parse_real_spec, parse_service_spec)

VERSION = "IP Virtual Server version 1.2.1 (size=4096)"
PLAIN_TITLE = ("Prot LocalAddress:Port Scheduler Flags\n"
               "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn")
ALL_PORT = ServiceKey("tcp", "10.0.0.1", 0)
REALS = [("10.0.0.2:0", 300, 7, 41, 2), ("10.0.0.3:0", 100, 3, 12, 1)]   # address, weight, persist, active, inact


def _plain() -> str:
    # print_service_entry: "%s %s" name, scheduler, " persistent %u"; reals "  -> %-28s %-7s %-6d %-10u %-10u"
    reals = [f"  -> {a:<28} {'Route':<7} {w:<6d} {act:<10d} {ina:<10d}" for a, w, _, act, ina in REALS]
    return "\n".join([VERSION, PLAIN_TITLE, "TCP  10.0.0.1:0 rr persistent 300", *reals]) + "\n"


def _persistent_conn() -> str:
    # print_title FMT_PERSISTENTCONN; reals "  -> %-28s %-9u %-11u %-10u %-10u" (weight, persistconns, ...)
    title = (f"{'Prot LocalAddress:Port':<33} {'Weight':<9} {'PersistConn':<11} {'ActiveConn':<10} {'InActConn':<10}\n"
             "  -> RemoteAddress:Port")
    reals = [f"  -> {a:<28} {w:<9d} {p:<11d} {act:<10d} {ina:<10d}" for a, w, p, act, ina in REALS]
    return "\n".join([VERSION, title, "TCP  10.0.0.1:0 rr persistent 300", *reals]) + "\n"


def _tun_info() -> str:
    # print_title FMT_TUN_INFO; reals "  -> %-28s %-7s %-13s %-6d %-10u %-10u" (TunnelInfo: fwd_tun_info or n/a)
    title = ("Prot LocalAddress:Port Scheduler Flags\n"
             "  -> RemoteAddress:Port           Forward TunnelInfo    Weight ActiveConn InActConn")
    reals = [f"  -> {'10.0.0.2:0':<28} {'Tunnel':<7} {'gue:6080:-c':<13} {300:<6d} {41:<10d} {2:<10d}",
             f"  -> {'10.0.0.3:0':<28} {'Route':<7} {'n/a':<13} {100:<6d} {12:<10d} {1:<10d}"]
    return "\n".join([VERSION, title, "TCP  10.0.0.1:0 rr persistent 300", *reals]) + "\n"


def _stats() -> str:
    # print_title FMT_STATS; "%-33s" then print_largenum --exact ("%*llu", at least 9 wide)
    cols = ("Conns", "InPkts", "OutPkts", "InBytes", "OutBytes")
    title = f"{'Prot LocalAddress:Port':<33} " + " ".join(f"{c:>8}" for c in cols) + "\n  -> RemoteAddress:Port"
    row = "".join(f"{v:9d}" for v in (53, 4_000, 0, 512_000, 0))
    return "\n".join([VERSION, title, f"{'TCP  10.0.0.1:0':<33}" + row, f"  -> {'10.0.0.2:0':<28}" + row]) + "\n"


def test_an_all_port_service_is_read_by_the_spec_and_the_listings_alike() -> None:
    assert parse_service_spec("tcp:10.0.0.1:0") == ALL_PORT   # before: "expected ADDRESS:PORT"
    assert ALL_PORT.label == "tcp:10.0.0.1:0"
    [svc] = parse_ipvsadm_list(_plain())
    assert svc.key == ALL_PORT and [r.key for r in svc.reals] == [RealKey("10.0.0.2", 0), RealKey("10.0.0.3", 0)]
    assert [parse_real_spec(a, ALL_PORT) for a, *_ in REALS] == [r.key for r in svc.reals]
    # kernel ip_vs_info_seq_show: "%s  %08X:%04X %s %s " then "persistent %d %08X"
    [proc] = parse_proc_ip_vs(f"{VERSION}\nProt LocalAddress:Port Scheduler Flags\n"
                              "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n"
                              "TCP  0A000001:0000 rr persistent 300 FFFFFFFF\n"
                              "  -> 0A000002:0000      Route   300    41         2         \n")
    assert proc.key == ALL_PORT and proc.reals[0].key == RealKey("10.0.0.2", 0)
    assert parse_ipvsadm(_stats()).rows[0].service == ALL_PORT


def test_port_0_of_a_real_is_taken_for_mark_and_all_port_services_only() -> None:
    with pytest.raises(ValueError, match="expected ADDRESS:PORT"):
        parse_real_spec("10.0.0.2:0")
    with pytest.raises(ValueError, match="expected ADDRESS:PORT"):
        parse_real_spec("10.0.0.2:0", ServiceKey("tcp", "10.0.0.1", 443))
    assert parse_real_spec("10.0.0.2:0", ServiceKey("fwm", fwmark=7)) == RealKey("10.0.0.2", 0)
    with pytest.raises(ValueError):
        parse_service_spec("tcp:10.0.0.1:65536")


def test_the_collector_reports_an_all_port_service(tmp_path: Path) -> None:
    stats = tmp_path / "stats.txt"
    stats.write_text(_stats())
    cfg = Config.model_validate({"host": "edge-ams-1", "proc_ip_vs": None, "proc_ip_vs_stats": None,
                                 "ipvsadm_stats_command": ["cat", str(stats)], "ipvsadm_rate_command": None})
    rnd = LvsCollector(cfg).collect()
    assert rnd.errors == []
    vs = [m for m in rnd.metrics if m.name == "ipvs_virtual_server"]
    assert [(m.tags["service"], m.tags["port"], m.fields["connections"]) for m in vs] == [("tcp:10.0.0.1:0", "0", 53)]


def test_a_persistent_conn_listing_is_refused_not_read_as_weights() -> None:
    # its columns are Weight PersistConn where the plain listing has Forward Weight: read as the plain one, every
    # weight was the real's count of persistent connections (7 and 3 instead of 300 and 100)
    with pytest.raises(LvsParseError, match="--persistent-conn listing"):
        parse_ipvsadm_list(_persistent_conn())


def test_a_stats_listing_is_refused_by_the_plain_parser() -> None:
    with pytest.raises(LvsParseError, match="--stats listing"):
        parse_ipvsadm_list(_stats())
    without_reals = "\n".join(_stats().splitlines()[:3]) + "\n"   # before: scheduler "53" and no error
    with pytest.raises(LvsParseError, match="--stats listing"):
        parse_ipvsadm_list(without_reals)


def test_a_tun_info_listing_is_read_with_its_tunnel_column() -> None:
    [svc] = parse_ipvsadm_list(_tun_info())   # before: "real server line needs address, forward, weight, ..."
    assert [(r.forward, r.tunnel, r.weight, r.active, r.inactive) for r in svc.reals] == [
        ("Tunnel", "gue:6080:-c", 300, 41, 2), ("Route", "n/a", 100, 12, 1)]


def test_thresholds_are_read_into_the_forward_and_weight_slots_as_before() -> None:
    title = (f"{'Prot LocalAddress:Port':<33} {'Uthreshold':<10} {'Lthreshold':<10} {'ActiveConn':<10} "
             f"{'InActConn':<10}\n  -> RemoteAddress:Port")
    text = "\n".join([VERSION, title, "TCP  10.0.0.1:0 rr persistent 300",
                      f"  -> {'10.0.0.2:0':<28} {500:<10d} {400:<10d} {41:<10d} {2:<10d}"]) + "\n"
    [svc] = parse_ipvsadm_list(text)
    assert [(r.forward, r.weight) for r in svc.reals] == [("500", 400)]


def test_a_plain_listing_whose_forward_column_is_a_number_is_refused() -> None:
    bad = _plain().replace("Route  ", "300    ", 1)
    with pytest.raises(LvsParseError, match="forward method '300'"):
        parse_ipvsadm_list(bad)


def test_the_proc_persistence_timeout_is_not_reported_as_seconds(tmp_path: Path) -> None:
    # ip_vs_info_seq_show prints svc->timeout, which ip_vs_add_service sets to timeout * HZ: "-p 300" on a HZ=250
    # kernel reads "persistent 75000". Reported as persistent_timeout, that claimed 75000 s.
    proc = tmp_path / "ip_vs"
    proc.write_text(f"{VERSION}\nProt LocalAddress:Port Scheduler Flags\n"
                    "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n"
                    "TCP  0A000001:0000 rr persistent 75000 FFFFFFFF\n"
                    "  -> 0A000002:0000      Route   300    41         2         \n")
    cfg = Config.model_validate({"host": "edge-ams-1", "proc_ip_vs": str(proc), "proc_ip_vs_stats": None,
                                 "ipvsadm_stats_command": None, "ipvsadm_rate_command": None})
    [vs] = [m for m in LvsCollector(cfg).collect().metrics if m.name == "ipvs_virtual_server"]
    assert "persistent_timeout" not in vs.fields
    assert (vs.fields["persistent"], vs.fields["persistent_timeout_ticks"]) == (1, 75000)
