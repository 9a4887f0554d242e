"""Parsers of ipmitool output: captured real output (testdata/) and hypothesis fuzzing."""

from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.collectors.ipmi.parse import (ParseError, classify_failure, parse_dcmi_power, parse_sdr_csv, pick_total,
                                   power_sensors)
from opsloop.collect.types import ERROR_KINDS
from tests.helpers import REPO

TESTDATA = REPO / "collectors" / "ipmi" / "testdata"


def captured(case: str) -> tuple[str, str]:
    return (TESTDATA / f"{case}.stdout").read_text(), (TESTDATA / f"{case}.stderr").read_text()


# --- captured output ----------------------------------------------------------------------------

def test_dcmi_reading_from_captured_output() -> None:
    r = parse_dcmi_power(captured("dcmi_power_reading")[0])
    assert (r.watts, r.minimum, r.maximum, r.average) == (155, 136, 248, 160)
    assert r.sample_period_s == 1
    assert r.active is True


def test_dcmi_deactivated_is_not_active() -> None:
    r = parse_dcmi_power(captured("dcmi_deactivated")[0])
    assert r.active is False
    assert r.watts == 0


def test_short_dcmi_reply_prints_garbage_watts() -> None:
    # ipmitool does not check the reply length: the collector's plausibility bound must catch it.
    r = parse_dcmi_power(captured("dcmi_short_reply")[0])
    assert r.watts > 10_000


def test_sdr_csv_from_captured_output() -> None:
    sensors = parse_sdr_csv(captured("sdr_elist_full")[0])
    assert [(s.name, s.value, s.unit, s.status) for s in sensors] == [
        ("Pwr Consumption", 205.0, "Watts", "ok"), ("PSU2 Power", None, "", "ns")]
    assert sensors[0].sensor_type == "Current"
    assert sensors[0].entity == "10.1"


@pytest.mark.parametrize("case, kind", [
    ("wrong_password", "auth"),
    ("unreachable", "unreachable"),
    ("dcmi_unsupported", "unsupported"),
])
def test_failures_are_classified_from_captured_output(case: str, kind: str) -> None:
    out, err = captured(case)
    got, message = classify_failure(out, err, 1)
    assert got == kind
    assert "Loading IANA" not in message  # -v noise is not a diagnosis


def test_unknown_failure_keeps_first_bytes() -> None:
    kind, message = classify_failure("", "segfault at 0xdeadbeef in frobnicate\n" + "x" * 500, 139)
    assert kind == "tool"
    assert "segfault at 0xdeadbeef" in message
    assert len(message) < 300


# --- parsing rules -----------------------------------------------------------------------------

def test_dcmi_garbage_is_a_parse_error_with_first_bytes() -> None:
    with pytest.raises(ParseError) as e:
        parse_dcmi_power("<html>502 Bad Gateway</html>")
    assert "<html>502 Bad Gateway" in str(e.value)


def test_dcmi_duplicated_field_is_rejected() -> None:
    text = captured("dcmi_power_reading")[0]
    with pytest.raises(ParseError, match="expected one"):
        parse_dcmi_power(text + text)


def test_sdr_line_with_wrong_shape_is_rejected() -> None:
    with pytest.raises(ParseError, match="columns"):
        parse_sdr_csv("Pwr Consumption,205,Watts,ok\nthis is not a sensor row\n")


def test_sdr_name_with_commas_is_rebuilt() -> None:
    row = "PS1, Input Power,420,Watts,ok,10.1,Power Supply,Current,,,,,,,,,,0.000,510.000"
    (s,) = parse_sdr_csv(row)
    assert (s.name, s.value, s.unit) == ("PS1, Input Power", 420.0, "Watts")


def test_sdr_watts_sensor_with_non_numeric_reading_is_rejected() -> None:
    with pytest.raises(ParseError, match="not a number"):
        parse_sdr_csv("Pwr Consumption,lots,Watts,ok")


def test_total_prefers_configured_then_total_named_then_sum() -> None:
    rows = "PSU1 Power,200,Watts,ok\nPSU2 Power,180,Watts,ok\nCPU Temp,50,degrees C,ok\n"
    sensors = power_sensors(parse_sdr_csv(rows))
    assert [s.name for s in sensors] == ["PSU1 Power", "PSU2 Power"]
    assert pick_total(sensors) == ("sum(2)", 380.0)
    assert pick_total(sensors, "PSU2 Power") == ("PSU2 Power", 180.0)
    with_total = power_sensors(parse_sdr_csv(rows + "Pwr Consumption,375,Watts,ok\n"))
    assert pick_total(with_total) == ("Pwr Consumption", 375.0)
    assert pick_total(sensors, "Missing") is None


# A BMC that only reports per-PSU input power (Dell/HPE naming): "Input Power" names each supply's share.
_PSU_ROW = "{name},{watts},Watts,ok,10.{n},Power Supply,Current,,,,,,,,,,0.000,255.000\n"


def test_per_psu_input_power_is_summed_not_taken_as_the_total() -> None:
    rows = "".join(_PSU_ROW.format(name=f"PSU{n} Input Power", watts=w, n=n) for n, w in ((1, 240), (2, 235)))
    assert pick_total(power_sensors(parse_sdr_csv(rows))) == ("sum(2)", 475.0)
    spaced = "PS 1 Input Power,240,Watts,ok\nPS 2 Input Power,235,Watts,ok\n"
    assert pick_total(power_sensors(parse_sdr_csv(spaced))) == ("sum(2)", 475.0)


def test_a_single_total_sensor_still_wins_over_per_psu_input_power() -> None:
    rows = (_PSU_ROW.format(name="PSU1 Input Power", watts=240, n=1)
            + _PSU_ROW.format(name="PSU2 Input Power", watts=235, n=2)
            + _PSU_ROW.format(name="System Input Power", watts=470, n=3))
    assert pick_total(power_sensors(parse_sdr_csv(rows))) == ("System Input Power", 470.0)
    # One un-numbered "Input Power" sensor is the host's (all supplies together).
    assert pick_total(power_sensors(parse_sdr_csv("Input Power,470,Watts,ok\nCPU Power,90,Watts,ok\n"))) == \
        ("Input Power", 470.0)


def test_negative_watts_reading_is_rejected_naming_the_sensor() -> None:
    rows = _PSU_ROW.format(name="PSU1 Input Power", watts=-3276, n=1) + _PSU_ROW.format(name="PSU2 Input Power",
                                                                                      watts=240, n=2)
    with pytest.raises(ParseError, match=r"'PSU1 Input Power' reads -3276 Watts, a negative power"):
        parse_sdr_csv(rows)
    # A negative reading in another unit (a temperature below zero) is not a power reading.
    (s,) = parse_sdr_csv("Inlet Temp,-5,degrees C,ok\n")
    assert s.value == -5.0


# --- fuzzing ------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_dcmi_parser_never_crashes(text: str) -> None:
    try:
        r = parse_dcmi_power(text)
    except ParseError as e:
        assert "output starts with" in str(e)
    else:
        assert r.watts >= 0


_WATTS = st.integers(min_value=0, max_value=65535)


@settings(max_examples=200, deadline=None)
@given(_WATTS, _WATTS, _WATTS, _WATTS, st.booleans(), st.text(alphabet=" \t", max_size=3))
def test_dcmi_parser_reads_what_ipmitool_prints(cur: int, lo: int, hi: int, avg: int, active: bool, pad: str) -> None:
    text = (f"\n    Instantaneous power reading:{pad}              {cur:8d} Watts\n"
            f"    Minimum during sampling period:           {lo:8d} Watts\n"
            f"    Maximum during sampling period:           {hi:8d} Watts\n"
            f"    Average power reading over sample period: {avg:8d} Watts\n"
            f"    IPMI timestamp:                           11/22/26 02:41:00 UTC"
            f"    Sampling period:                          00000001 Seconds.\n"
            f"    Power reading state is:                   {'activated' if active else 'deactivated'}\n\n")
    r = parse_dcmi_power(text)
    assert (r.watts, r.minimum, r.maximum, r.average, r.active) == (cur, lo, hi, avg, active)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_sdr_parser_never_crashes(text: str) -> None:
    try:
        sensors = parse_sdr_csv(text)
    except ParseError as e:
        assert "output starts with" in str(e)
    else:
        for s in sensors:
            assert s.name
            pick_total(power_sensors(sensors))


# Sensor names: printable ASCII without commas (ipmitool's CSV does not quote); the parser
# rebuilds names with commas only in the 18-column shape, tested above.
_NAME = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters=","),
                min_size=1, max_size=16).filter(lambda s: s.strip() == s and s != "")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_NAME, st.one_of(st.none(), st.integers(0, 5000))), min_size=1, max_size=8))
def test_sdr_parser_reads_generated_rows(rows: list[tuple[str, int | None]]) -> None:
    text = "".join(f"{n},{'' if v is None else v},{'' if v is None else 'Watts'},{'ns' if v is None else 'ok'},"
                   f"10.1,Power Supply,Current,,,,,,,,,,0.000,255.000\n" for n, v in rows)
    sensors = parse_sdr_csv(text)
    assert [(s.name, s.value) for s in sensors] == [(n, None if v is None else float(v)) for n, v in rows]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=500), st.text(max_size=500), st.integers(-255, 255))
def test_classifier_never_crashes_and_names_a_known_kind(out: str, err: str, rc: int) -> None:
    kind, message = classify_failure(out, err, rc)
    assert kind in ERROR_KINDS
    assert message
