"""Parsers and unit conversions of the throughput collector, on output captured from the real tools
(collectors/netperf/testdata) and fuzzed with hypothesis."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.collectors.netperf.parse import (ParseError, ToolReportedError, parse_iperf3, parse_netperf,
                                      parse_omni_csv, parse_omni_keyval)
from opsloop.collectors.netperf.units import UnitError, bits_per_second_factor, to_bits_per_second, to_gbps
from tests.helpers import REPO

TESTDATA = REPO / "collectors" / "netperf" / "testdata"


def read(name: str) -> str:
    return (TESTDATA / name).read_text()


# -- units ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("unit, factor", [
    ("10^3bits/s", 1e3), ("10^6bits/s", 1e6), ("10^9bits/s", 1e9),
    ("Bytes/s", 8.0), ("KBytes/s", 8.0 * 1024), ("MBytes/s", 8.0 * 1024 * 1024),
    ("GBytes/s", 8.0 * 1024 * 1024 * 1024),
])
def test_every_netperf_unit_has_an_explicit_factor(unit: str, factor: float) -> None:
    assert bits_per_second_factor(unit) == factor


def test_published_figure_in_gbps() -> None:
    # "Tuning Virtualized Network Node: multi-queue virtio-net": 8.42 Gb/s printed by netperf -f m as 8420 10^6bits/s
    assert to_gbps(to_bits_per_second(8420.0, "10^6bits/s")) == pytest.approx(8.42)


@pytest.mark.parametrize("unit", ["Trans/s", "Mbits/s", "", "10^bits/s", "kbytes/s"])
def test_unknown_unit_is_named(unit: str) -> None:
    with pytest.raises(UnitError) as e:
        bits_per_second_factor(unit)
    assert f"{unit!r}" in str(e.value)


# -- netperf omni output captured on this machine -----------------------------------------------------

def test_keyval_output_captured() -> None:
    r = parse_netperf(read("netperf_omni_k.txt"), "keyval")
    assert r.bits_per_second == pytest.approx(5932.08e6)
    assert r.elapsed_s == pytest.approx(1.01)
    assert r.protocol == "TCP"


def test_csv_output_captured() -> None:
    r = parse_netperf(read("netperf_omni_o.txt"), "csv")
    assert r.bits_per_second == pytest.approx(4582.33e6)
    assert r.protocol == "TCP"


def test_csv_with_banner_and_header_reads_the_data_line() -> None:
    r = parse_netperf(read("netperf_omni_o_with_banner.txt"), "csv")
    assert r.bits_per_second == pytest.approx(4737.20e6)


@pytest.mark.parametrize("name, expected_bps", [
    ("netperf_omni_o_fg.txt", 4.45e9),
    ("netperf_omni_o_fk.txt", 10042164.40e3),
    ("netperf_omni_o_fB.txt", 769085097.03 * 8),
    ("netperf_omni_o_fK.txt", 486216.43 * 8 * 1024),
    ("netperf_omni_o_fM.txt", 551.48 * 8 * 1024**2),
    ("netperf_omni_o_fG.txt", 0.96 * 8 * 1024**3),
])
def test_each_captured_unit_converts(name: str, expected_bps: float) -> None:
    assert parse_netperf(read(name), "csv").bits_per_second == pytest.approx(expected_bps)


def test_no_server_output_is_a_parse_error_with_its_first_bytes() -> None:
    with pytest.raises(ParseError) as e:
        parse_netperf(read("netperf_no_server.stdout"), "keyval")
    assert "establish control" in str(e.value)


@pytest.mark.parametrize("text, needle", [
    ("", "printed nothing"),
    ("1.0,10^6bits/s,1.00\n", "3 fields, expected 4"),
    ("abc,10^6bits/s,1.00,TCP\n", "'abc' is not a number"),
    ("-5,10^6bits/s,1.00,TCP\n", "non-negative"),
    ("nan,10^6bits/s,1.00,TCP\n", "finite"),
    ("12.5,furlongs/s,1.00,TCP\n", "unknown throughput unit 'furlongs/s'"),
])
def test_bad_csv_names_the_problem(text: str, needle: str) -> None:
    with pytest.raises(ParseError) as e:
        parse_netperf(text, "csv")
    assert needle in str(e.value)


@pytest.mark.parametrize("text, needle", [
    ("THROUGHPUT_UNITS=10^6bits/s\n", "lacks THROUGHPUT"),
    ("THROUGHPUT=1\nTHROUGHPUT=2\nTHROUGHPUT_UNITS=10^6bits/s\n", "repeats key THROUGHPUT"),
    ("garbage\n", "no KEY=value lines"),
    ("THROUGHPUT=12\nTHROUGHPUT_UNITS=Trans/s\n", "Trans/s"),
])
def test_bad_keyval_names_the_problem(text: str, needle: str) -> None:
    with pytest.raises(ParseError) as e:
        parse_netperf(text, "keyval")
    assert needle in str(e.value)


def test_parse_error_keeps_first_bytes_bounded() -> None:
    with pytest.raises(ParseError) as e:
        parse_netperf("x" * 5000, "csv")
    assert "xxxx" in str(e.value) and len(str(e.value)) < 400


@pytest.mark.parametrize("text", ["THROUGHPUT=1e308\nTHROUGHPUT_UNITS=GBytes/s\n",
                                  "THROUGHPUT=1e300\nTHROUGHPUT_UNITS=10^99bits/s\n"])
def test_throughput_that_overflows_once_scaled_is_a_parse_error(text: str) -> None:
    # Finite as printed, infinite in bits/s: the check must be on the converted value.
    with pytest.raises(ParseError, match="not a finite bit rate once converted"):
        parse_netperf(text)


# -- iperf3 -J ------------------------------------------------------------------------------------

def test_iperf3_json_captured_uses_receiver_sum() -> None:
    text = read("iperf3_tcp_2streams.json")
    doc = json.loads(text)
    r = parse_iperf3(text)
    assert r.bits_per_second == doc["end"]["sum_received"]["bits_per_second"]
    assert r.retransmits == doc["end"]["sum_sent"]["retransmits"]
    assert r.protocol == "TCP"


@pytest.mark.parametrize("name, needle", [("iperf3_refused.json", "Connection refused"),
                                          ("iperf3_busy.json", "server is busy")])
def test_iperf3_reported_errors(name: str, needle: str) -> None:
    with pytest.raises(ToolReportedError) as e:
        parse_iperf3(read(name))
    assert needle in str(e.value)


@pytest.mark.parametrize("text, needle", [
    ("not json", "not JSON"),
    ("[1, 2]", "JSON list"),
    ('{"end": {}}', "lacks end.sum_received"),
    ('{"end": {"sum_received": {"bits_per_second": "fast"}}}', "'fast'"),
    ('{"end": {"sum_received": {"bits_per_second": -1}}}', "non-negative"),
    ('{"end": {"sum_received": {"bits_per_second": true}}}', "True"),
])
def test_iperf3_bad_json_names_the_problem(text: str, needle: str) -> None:
    with pytest.raises(ParseError) as e:
        parse_iperf3(text)
    assert needle in str(e.value)


# -- fuzzing: any text either parses to a sane result or raises ParseError ---------------------------

_omni_lines = st.lists(
    st.one_of(st.text(max_size=60),
              st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["THROUGHPUT", "THROUGHPUT_UNITS", "ELAPSED_TIME",
                                                                   "PROTOCOL", "X"]), st.text(max_size=20))),
    max_size=8).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(), _omni_lines))
def test_fuzz_netperf_parsers_only_raise_parse_error(text: str) -> None:
    for fmt in ("keyval", "csv"):
        try:
            r = parse_netperf(text, fmt)  # type: ignore[arg-type]
        except ParseError:
            continue
        assert r.bits_per_second >= 0 and r.bits_per_second == r.bits_per_second


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(st.text(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.sampled_from(["end", "sum_received", "sum_sent", "bits_per_second", "error", "seconds",
                         "retransmits", "start"]), kids, max_size=4),
    max_leaves=12).map(json.dumps)))
def test_fuzz_iperf3_parser_only_raises_its_errors(text: str) -> None:
    try:
        r = parse_iperf3(text)
    except (ParseError, ToolReportedError):
        return
    assert r.bits_per_second >= 0


_UNITS = ["10^3bits/s", "10^6bits/s", "10^9bits/s", "Bytes/s", "KBytes/s", "MBytes/s", "GBytes/s"]


@settings(max_examples=200, deadline=None)
@given(value=st.floats(min_value=0, max_value=1e7, allow_nan=False), unit=st.sampled_from(_UNITS),
       elapsed=st.floats(min_value=0.01, max_value=1e4), banner=st.booleans())
def test_fuzz_round_trip_both_formats(value: float, unit: str, elapsed: float, banner: bool) -> None:
    shown = f"{value:.2f}"
    expected = float(shown) * bits_per_second_factor(unit)
    head = "MIGRATED TCP STREAM TEST from 0.0.0.0 () port 0 AF_INET : demo\n" if banner else ""
    csv = parse_omni_csv(f"{head}{shown},{unit},{elapsed:.2f},TCP\n")
    assert csv["THROUGHPUT_UNITS"] == unit
    keyval = parse_omni_keyval(f"{head}THROUGHPUT={shown}\nTHROUGHPUT_UNITS={unit}\nELAPSED_TIME={elapsed:.2f}\n"
                               "PROTOCOL=TCP\n")
    for fmt, text in (("csv", f"{head}{shown},{unit},{elapsed:.2f},TCP\n"),
                      ("keyval", f"THROUGHPUT={shown}\nTHROUGHPUT_UNITS={unit}\n")):
        assert parse_netperf(text, fmt).bits_per_second == pytest.approx(expected)  # type: ignore[arg-type]
    assert keyval["PROTOCOL"] == "TCP"
