"""LVS collector: parsers on recorded /proc and ipvsadm output, rates across wraps and resets,
the real ipvsadm on a kernel without IPVS, fuzzing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opsloop.collectors.lvs import Config, build
from opsloop.collectors.lvs.collector import LvsCollector
from opsloop.lb.ipvs import (LvsParseError, RealKey, ServiceKey, parse_ipvsadm, parse_ipvsadm_list,
                                  parse_proc_ip_vs, parse_proc_ip_vs_stats)
from opsloop.collectors.lvs.rates import RateTracker, counter_increase
from opsloop.collect.types import CollectorUnavailable
from tests.helpers import REPO

TESTDATA = REPO / "collectors" / "lvs" / "testdata"
PROC = TESTDATA / "proc_net_ip_vs.txt"
PROC_STATS = TESTDATA / "proc_net_ip_vs_stats.txt"
STATS = [TESTDATA / f"ipvsadm_stats_exact.t{t}.txt" for t in (0, 1, 2)]
RATE = TESTDATA / "ipvsadm_rate_exact.txt"
MYSQL = ServiceKey("tcp", "192.168.0.22", 3306)


class FakeClock:
    """Monotonic time the test controls: rates are computed over known intervals."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _collector(tmp_path: Path, stats: Path | None = STATS[0], **over) -> tuple[LvsCollector, FakeClock, Path]:
    live = tmp_path / "ipvsadm_stats.txt"
    if stats is not None:
        shutil.copy(stats, live)
    cfg = Config.model_validate({"host": "edge-ams-1", "proc_ip_vs": str(PROC), "proc_ip_vs_stats": str(PROC_STATS),
                                 "ipvsadm_stats_command": ["cat", str(live)],
                                 "ipvsadm_rate_command": ["cat", str(RATE)], **over})
    clock = FakeClock()
    return LvsCollector(cfg, clock=clock), clock, live


def _find(metrics, name, **tags):
    hits = [m for m in metrics if m.name == name and all(m.tags.get(k) == v for k, v in tags.items())]
    assert len(hits) == 1, (name, tags, hits)
    return hits[0]


def test_proc_ip_vs_fixture_parses():
    services = parse_proc_ip_vs(PROC.read_text())
    assert [s.key.label for s in services] == ["tcp:192.168.0.22:3306", "tcp:192.168.0.57:3306",
                                               "tcp:192.168.0.55:3306", "tcp:[2620::1]:80", "fwm:268439552"]
    first = services[0]
    assert first.scheduler == "wlc" and [(r.key.address, r.weight, r.active, r.inactive) for r in first.reals] == [
        ("192.168.82.22", 100, 248, 2), ("192.168.83.24", 100, 248, 2), ("192.168.83.21", 100, 248, 1)]
    v6 = services[3]
    assert (v6.key.family, v6.scheduler, v6.reals[2].key) == ("inet6", "sh", RealKey("2620::4", 80, "inet6"))
    assert services[4].reals[1].forward == "Route"


def test_proc_ip_vs_flags_and_trailing_blanks():
    services = parse_proc_ip_vs((TESTDATA / "proc_net_ip_vs.flags.txt").read_text())
    assert services[1].persistent_timeout == 300 and services[2].one_packet and services[2].key.protocol == "udp"
    assert services[2].reals[0].forward == "Masq" and services[3].reals[0].weight == 20


def test_proc_ip_vs_stats_fixture_hex():
    s = parse_proc_ip_vs_stats(PROC_STATS.read_text())
    assert s["connections"] == 0x16AA370 and s["pkts_in"] == 0xE33656E5 and s["bytes_in"] == 0x51D8C8883AB3
    assert (s["cps"], s["pps_in"], s["bps_in"], s["bps_out"]) == (4, 0x1FB3C, 0x1282A8F, 0)


def test_ipvsadm_listings_parse_and_match_proc_keys():
    stats = parse_ipvsadm(STATS[0].read_text())
    assert stats.kind == "stats" and len(stats.rows) == 18
    proc_keys = {(s.key, r.key) for s in parse_proc_ip_vs(PROC.read_text()) for r in s.reals}
    assert {(row.service, row.real) for row in stats.rows if row.real} == proc_keys
    fwm = [row for row in stats.rows if row.service.protocol == "fwm" and row.real is None][0]
    assert fwm.values["connections"] == 99878
    rate = parse_ipvsadm(RATE.read_text())
    assert rate.kind == "rate" and rate.rows[0].values == {"cps": 8, "pps_in": 1794, "pps_out": 0,
                                                           "bps_in": 237334, "bps_out": 0}


@pytest.mark.parametrize("text, reason", [
    ((TESTDATA / "ipvsadm_stats_abbreviated.txt").read_text(), "--exact"),
    ("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n", "not a --stats"),
    ("TCP  1.2.3.4:80 1 2 3 4 5\n", "before the"),
    ("Prot LocalAddress:Port Conns InPkts OutPkts InBytes OutBytes\nTCP  lvs-vip:http 1 2 3 4 5\n", "needs -n"),
    ("Prot LocalAddress:Port Conns InPkts OutPkts InBytes OutBytes\n  -> 1.2.3.4:80 1 2 3 4 5\n", "before any"),
])
def test_ipvsadm_bad_input_is_a_clear_error(text, reason):
    with pytest.raises(LvsParseError, match=reason):
        parse_ipvsadm(text)


def test_collector_merges_sources_with_telegraf_names(tmp_path):
    coll, _, _ = _collector(tmp_path)
    rnd = coll.collect()
    assert rnd.errors == []
    vs = _find(rnd.metrics, "ipvs_virtual_server", service="tcp:192.168.0.22:3306")
    assert set(vs.tags) == {"host", "service", "address", "port", "protocol", "address_family", "sched"}
    assert (vs.tags["protocol"], vs.tags["address_family"], vs.tags["sched"]) == ("tcp", "inet", "wlc")
    assert vs.fields["active_connections"] == 744 and vs.fields["weight_total"] == 300
    assert vs.fields["cps"] == 8 and "connections_rate" not in vs.fields  # first round: no rate yet
    fwm = _find(rnd.metrics, "ipvs_virtual_server", fwmark="268439552")
    assert "address" not in fwm.tags
    for rs in [m for m in rnd.metrics if m.name == "ipvs_real_server"]:
        assert {"weight", "connections", "bytes_in"} <= set(rs.fields), rs  # both sources joined
        assert {"virtual_address", "virtual_fwmark"} & set(rs.tags)
        assert next(iter(rs.tags)) == "host"
    totals = _find(rnd.metrics, "ipvs_totals")
    assert totals.fields["connections"] == 0x16AA370 and totals.fields["pps_in"] == 0x1FB3C


def test_rates_from_counter_deltas(tmp_path):
    coll, clock, live = _collector(tmp_path)
    coll.collect()
    clock.now += 15
    shutil.copy(STATS[1], live)
    rnd = coll.collect()
    before = {(r.service, r.real): r.values for r in parse_ipvsadm(STATS[0].read_text()).rows}
    after = {(r.service, r.real): r.values for r in parse_ipvsadm(STATS[1].read_text()).rows}
    real = RealKey("192.168.82.22", 3306)
    rs = _find(rnd.metrics, "ipvs_real_server", address="192.168.82.22", virtual_address="192.168.0.22")
    for name in ("connections", "pkts_in", "bytes_in"):
        assert rs.fields[f"{name}_rate"] == pytest.approx((after[(MYSQL, real)][name] - before[(MYSQL, real)][name]) / 15)
    assert rs.fields["connections_rate"] > 0 and rs.fields["counter_reset"] == 0
    vs = _find(rnd.metrics, "ipvs_virtual_server", service="tcp:192.168.0.22:3306")
    assert vs.fields["connections_rate"] == pytest.approx(
        (after[(MYSQL, None)]["connections"] - before[(MYSQL, None)]["connections"]) / 15)


def test_counter_reset_gives_no_negative_rate(tmp_path):
    coll, clock, live = _collector(tmp_path, stats=STATS[2])
    coll.collect()
    clock.now += 10
    shutil.copy(STATS[0], live)  # counters went down: ipvsadm -Z / service re-created
    rnd = coll.collect()
    rates = [(k, v) for m in rnd.metrics for k, v in m.fields.items() if k.endswith("_rate")]
    assert rates and all(v >= 0 for _, v in rates)
    rs = _find(rnd.metrics, "ipvs_real_server", address="192.168.82.22", virtual_address="192.168.0.22")
    assert rs.fields["counter_reset"] == 1
    assert rs.fields["connections_rate"] == pytest.approx(rs.fields["connections"] / 10)


def test_32bit_packet_counter_wrap(tmp_path):
    near_top = (1 << 32) - 1000
    text = STATS[0].read_text()
    coll, clock, live = _collector(tmp_path)
    live.write_text(text.replace(" 983554101 ", f" {near_top} "))
    coll.collect()
    clock.now += 5
    live.write_text(text.replace(" 983554101 ", " 500 "))
    rs = _find(coll.collect().metrics, "ipvs_real_server", address="192.168.82.22", virtual_address="192.168.0.22")
    assert rs.fields["pkts_in_rate"] == pytest.approx(1500 / 5) and rs.fields["counter_reset"] == 0


def test_reset_64bit_bytes_counter_just_under_2_to_32_is_not_a_wrap(tmp_path):
    # The recording's real server already stands at 4294000000 bytes (a 32-bit "top quarter" value); bytes
    # are 64-bit in every source, so going down to 1500 is a reset, not a wrap adding ~967 kB.
    text = STATS[0].read_text()
    coll, clock, live = _collector(tmp_path)
    coll.collect()
    clock.now += 5
    live.write_text(text.replace(" 4294000000 ", " 1500 "))   # ipvsadm -Z on that server's counters
    rs = _find(coll.collect().metrics, "ipvs_real_server", address="192.168.82.22", virtual_address="192.168.0.22")
    assert rs.fields["bytes_in_rate"] == pytest.approx(1500 / 5)
    assert rs.fields["counter_reset"] == 1


@pytest.mark.parametrize("name", ["bytes_in", "bytes_out"])
def test_bytes_counters_are_64bit_in_the_tracker(name):
    t = RateTracker()
    t.update("k", {name: 3_500_000_000, "pkts_in": (1 << 32) - 100}, 0.0)
    r = t.update("k", {name: 10, "pkts_in": 100}, 10.0)
    assert r is not None and r.reset
    # bytes reset, so the row was reset: its packets too (read as a 32-bit wrap, a reset invented 2^32 - prev)
    assert r.per_second == {name: 1.0, "pkts_in": 10.0}


def test_service_missing_for_a_round_starts_afresh(tmp_path):
    coll, clock, live = _collector(tmp_path, proc_ip_vs=None, proc_ip_vs_stats=None)
    coll.collect()
    without = "\n".join(line for line in STATS[0].read_text().splitlines() if "[2620" not in line) + "\n"
    live.write_text(without)
    clock.now += 5
    assert not [m for m in coll.collect().metrics if m.tags.get("address_family") == "inet6"]
    shutil.copy(STATS[1], live)
    clock.now += 5
    rnd = coll.collect()
    v6 = _find(rnd.metrics, "ipvs_virtual_server", service="tcp:[2620::1]:80")
    assert "connections_rate" not in v6.fields
    assert "connections_rate" in _find(rnd.metrics, "ipvs_virtual_server", service="tcp:192.168.0.22:3306").fields


def test_wrong_listing_kind_and_bad_proc_file_are_errors(tmp_path):
    bad = tmp_path / "ip_vs"
    bad.write_text("garbage\n")
    coll, _, _ = _collector(tmp_path, ipvsadm_rate_command=["cat", str(STATS[0])], proc_ip_vs=str(bad))
    rnd = coll.collect()
    kinds = {e.target: e.kind for e in rnd.errors}
    assert kinds == {str(bad): "parse", f"cat {STATS[0]}": "parse"}
    assert any("--rate" in e.message for e in rnd.errors)
    assert _find(rnd.metrics, "ipvs_totals")  # the good sources still report


@pytest.mark.integration
def test_real_ipvsadm_on_kernel_without_ipvs(tmp_path):
    assert shutil.which("ipvsadm"), "ipvsadm missing: run setup.d/50-fw.sh"
    # Real ipvsadm, real /proc paths: nothing can be read on this kernel.
    with pytest.raises(CollectorUnavailable, match="ip_vs"):
        build(Config(host="edge-1")).collect()
    # Real ipvsadm next to recorded /proc files: ipvsadm's failure is reported, the rest still reads.
    cfg = Config(host="edge-1", proc_ip_vs=PROC, proc_ip_vs_stats=PROC_STATS)
    rnd = build(cfg).collect()
    assert {(e.target, e.kind) for e in rnd.errors} == {
        ("ipvsadm -Ln --stats --exact", "unsupported"), ("ipvsadm -Ln --rate --exact", "unsupported")}
    assert "Protocol not available" in rnd.errors[0].message
    assert len([m for m in rnd.metrics if m.name == "ipvs_real_server"]) == 13


@pytest.mark.integration
def test_missing_and_hanging_ipvsadm(tmp_path):
    coll, _, _ = _collector(tmp_path, ipvsadm_stats_command=["/nonexistent/ipvsadm", "-Ln"],
                            ipvsadm_rate_command=["sleep", "30"], timeout_s=0.5)
    rnd = coll.collect()
    assert {e.kind for e in rnd.errors} == {"tool", "timeout"}


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match="all sources are disabled"):
        Config(proc_ip_vs=None, proc_ip_vs_stats=None, ipvsadm_stats_command=None, ipvsadm_rate_command=None)
    with pytest.raises(ValidationError, match="timeout_s"):
        Config(timeout_s=0)
    with pytest.raises(ValidationError, match="extra"):
        Config(ipvsadm="x")


@given(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1))
def test_counter_increase_is_never_negative(prev, cur):
    inc, reset = counter_increase(prev, cur)
    assert inc >= 0
    if cur >= prev:
        assert (inc, reset) == (cur - prev, False)


def test_rate_tracker_first_sample_and_clock_not_advancing():
    t = RateTracker()
    assert t.update("k", {"c": 10}, 1.0) is None
    assert t.update("k", {"c": 20}, 1.0) is None  # no interval: no rate
    r = t.update("k", {"c": 40}, 3.0)
    assert r is not None and r.per_second == {"c": 10.0}


_FIXTURES = [p.read_text() for p in (PROC, PROC_STATS, STATS[0], RATE)]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("TCPUDFWM->[]:0123456789ABCDEFabcdef .\nKMGIPVSrsion()")), max_size=300))
def test_fuzz_parsers_on_garbage(text):
    for parser in (parse_proc_ip_vs, parse_proc_ip_vs_stats, parse_ipvsadm, parse_ipvsadm_list):
        try:
            parser(text)
        except LvsParseError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 3), st.integers(0, 5000), st.integers(0, 40), st.text(max_size=8))
def test_fuzz_parsers_on_mutated_recordings(which, pos, cut, junk):
    base = _FIXTURES[which]
    pos %= len(base)
    text = base[:pos] + junk + base[pos + cut:]
    for parser in (parse_proc_ip_vs, parse_proc_ip_vs_stats, parse_ipvsadm, parse_ipvsadm_list):
        try:
            parser(text)
        except LvsParseError as e:
            assert "line" in str(e)
