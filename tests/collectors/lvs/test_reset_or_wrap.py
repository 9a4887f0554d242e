"""A counter that went down is a reset or a 32-bit wrap; the row's 64-bit byte counters tell which. ``ipvsadm -Z``
(or a re-created service, a reboot) on a service whose 64-bit connection counter stood between 3/4 * 2^32 and
2^32 was read as a 32-bit wrap: ~3e8 invented connections in one interval, a demand spike. A real wrap (bytes go
on) is still rated across."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from opsloop.collectors.lvs import Config
from opsloop.collectors.lvs.collector import LvsCollector
from opsloop.collectors.lvs.rates import RateTracker
from tests.helpers import REPO

TESTDATA = REPO / "collectors" / "lvs" / "testdata"
_spec = importlib.util.spec_from_file_location("render_ipvsadm", TESTDATA / "render_ipvsadm.py")
assert _spec is not None and _spec.loader is not None
render_ipvsadm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_ipvsadm)

SERVICE, REAL = "TCP  192.0.2.10:443", "10.0.0.2:443"
INTERVAL = 15.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _listing(conns: int, pkts: int, bytes_in: int) -> str:
    """``ipvsadm -Ln --stats --exact`` in ipvsadm 1.31's layout: one service, one real server, same counters."""
    row = [conns, pkts, 0, bytes_in, 0]
    return render_ipvsadm.render([(SERVICE, row, [(REAL, row)])], "stats", exact=True)


def _proc_stats(conns: int, pkts: int, bytes_in: int) -> str:
    """``/proc/net/ip_vs_stats`` as ip_vs_ctl.c ``ip_vs_stats_show`` prints it (``%8LX`` / ``%16LX``)."""
    return ("   Total Incoming Outgoing         Incoming         Outgoing\n"
            "   Conns  Packets  Packets            Bytes            Bytes\n"
            f"{conns:8X} {pkts:8X} {0:8X} {bytes_in:16X} {0:16X}\n\n"
            " Conns/s   Pkts/s   Pkts/s          Bytes/s          Bytes/s\n"
            f"{4:8X} {100:8X} {0:8X} {9000:16X} {0:16X}\n")


def _two_rounds(tmp_path: Path, before: tuple[int, int, int],
                after: tuple[int, int, int]) -> dict[str, dict]:
    stats, proc = tmp_path / "stats.txt", tmp_path / "ip_vs_stats"
    stats.write_text(_listing(*before))
    proc.write_text(_proc_stats(*before))
    cfg = Config.model_validate({"host": "edge-ams-1", "proc_ip_vs": None, "proc_ip_vs_stats": str(proc),
                                 "ipvsadm_stats_command": ["cat", str(stats)], "ipvsadm_rate_command": None})
    clock = FakeClock()
    coll = LvsCollector(cfg, clock=clock)
    assert not coll.collect().errors
    clock.now += INTERVAL
    stats.write_text(_listing(*after))
    proc.write_text(_proc_stats(*after))
    rnd = coll.collect()
    assert not rnd.errors
    return {m.name: m.fields for m in rnd.metrics}


def test_zeroed_counters_of_a_busy_service_are_a_reset_not_a_wrap(tmp_path: Path) -> None:
    # 3.5e9 connections on 64-bit counters (ipvsadm 1.31 prints stats64; /proc %8LX), then ipvsadm -Z:
    # 120 connections since. Old code: (2^32 - 3.5e9 + 120) / 15 s = 5e7 connections/s, unflagged as a reset.
    rows = _two_rounds(tmp_path, before=(3_500_000_000, 9_000_000_000, 700_000_000_000), after=(120, 2_400, 180_000))
    for name in ("ipvs_virtual_server", "ipvs_real_server", "ipvs_totals"):
        fields = rows[name]
        assert fields["counter_reset"] == 1, name
        assert fields["connections_rate"] == pytest.approx(120 / INTERVAL), name
        assert fields["pkts_in_rate"] == pytest.approx(2_400 / INTERVAL), name
        assert fields["bytes_in_rate"] == pytest.approx(180_000 / INTERVAL), name


def test_a_32bit_wrap_while_traffic_goes_on_is_still_rated_across(tmp_path: Path) -> None:
    # an older source's 32-bit connection counter passes 2^32 while bytes (64-bit everywhere) keep rising
    top = (1 << 32) - 1_000
    rows = _two_rounds(tmp_path, before=(top, 5_000_000, 900_000_000_000), after=(500, 5_030_000, 900_004_500_000))
    for name in ("ipvs_virtual_server", "ipvs_real_server", "ipvs_totals"):
        fields = rows[name]
        assert fields["counter_reset"] == 0, name
        assert fields["connections_rate"] == pytest.approx(1_500 / INTERVAL), name
        assert fields["bytes_in_rate"] == pytest.approx(4_500_000 / INTERVAL), name


def test_a_row_without_byte_counters_never_reads_a_drop_as_a_wrap() -> None:
    # nothing to tell a wrap from a reset: the reset loses an interval, a wrong wrap would invent 2^32 - prev
    t = RateTracker()
    t.update("k", {"connections": 3_500_000_000}, 0.0)
    r = t.update("k", {"connections": 50}, 10.0)
    assert r is not None and r.reset and r.per_second == {"connections": 5.0}
