"""HAProxy collector and runtime API: recorded output, fuzzed parser, and the real HAProxy."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.collectors.haproxy import Config, build
from opsloop.collectors.haproxy.collector import HaproxyCollector, row_to_metric
from opsloop.lb.haproxy import HaproxyAPI, HaproxyError, StatParseError, parse_show_stat, parse_show_stat_rows
from opsloop.lab.traffic import TrafficGenerator
from opsloop.validation import WireError
from tests.helpers import REPO, wait_until

TESTDATA = REPO / "collectors" / "haproxy" / "testdata"


def test_recorded_show_stat_parses_into_samples() -> None:
    rows = parse_show_stat((TESTDATA / "show_stat_haproxy26.csv").read_text())
    kinds = {(r["pxname"], r["svname"]) for r in rows}
    assert {("fe_web", "FRONTEND"), ("be_web", "near"), ("be_web", "far"), ("be_web", "BACKEND")} <= kinds
    ms = [row_to_metric(r, "edge1", 1795310400) for r in rows]
    near = next(m for m in ms if m.tags["sv"] == "near")
    assert near.tags == {"host": "edge1", "proxy": "be_web", "sv": "near", "type": "server"}
    assert isinstance(near.fields["stot"], int) and near.fields["status"] == "UP"
    assert "pxname" not in near.fields


@pytest.mark.parametrize("text, needle", [
    ("", "header"), ("hello", "header"), ("# foo,bar\n1,2\n", "pxname,svname"),
    ("# pxname,svname,x\na\n\n", "line 2"),
])
def test_bad_show_stat_is_a_clear_error(text: str, needle: str) -> None:
    with pytest.raises(StatParseError, match=needle):
        parse_show_stat(text)


RECORDED = (TESTDATA / "show_stat_haproxy26.csv").read_text()


def recorded_with(svname: str, edit: Callable[[list[str]], list[str]], text: str = RECORDED) -> str:
    """The recorded reply with the data row of ``svname`` edited field by field."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        fields = line.split(",")
        if len(fields) > 1 and fields[1] == svname:
            lines[i] = ",".join(edit(fields))
    return "\n".join(lines) + "\n"


def _set_stot(value: str) -> Callable[[list[str]], list[str]]:
    return lambda f: f[:7] + [value] + f[8:]   # column 8 is stot


def test_torn_row_is_refused_by_name_and_the_other_rows_kept() -> None:
    # The reply cut inside the BACKEND row's stot (121 -> 12): zipping it emitted stot=12 as good.
    torn = recorded_with("BACKEND", lambda f: f[:7] + ["12"])
    rows, errors = parse_show_stat_rows(torn)
    assert [r["svname"] for r in rows] == ["FRONTEND", "near", "far"]
    [err] = errors
    assert "line 5 (be_web/BACKEND): 8 columns, expected 129" in err
    with pytest.raises(StatParseError, match="be_web/BACKEND"):
        parse_show_stat(torn)
    # The untouched reply: every row has the header's 129 fields, trailing comma included.
    assert parse_show_stat_rows(RECORDED) == (parse_show_stat(RECORDED), [])


@pytest.mark.parametrize("value", ["nan", "inf", "-Infinity", "1e999"])
def test_non_finite_counter_is_refused_for_its_row(value: str) -> None:
    rows = parse_show_stat(recorded_with("near", _set_stot(value)))
    near = next(r for r in rows if r["svname"] == "near")
    # The cell as HAProxy sent it is named ('1e999', not the inf float() made of it).
    with pytest.raises(WireError, match=rf"^fields\.stot: '{value}' is not a finite number$"):
        row_to_metric(near, "edge1", 1795310400)


def test_bad_rows_cost_only_themselves_and_are_counted_in_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # near: stot 'nan'; BACKEND: torn after its 8th field.
    text = recorded_with("BACKEND", lambda f: f[:8], recorded_with("near", _set_stot("nan")))
    monkeypatch.setattr(HaproxyAPI, "show_stat", lambda self: text)
    rnd = HaproxyCollector({"lb1": "/unused.sock"}).collect()
    # The rows after the bad one are still emitted, with their real values.
    assert [(m.tags["sv"], m.fields["stot"]) for m in rnd.metrics] == [("FRONTEND", 8), ("far", 60)]
    [err] = rnd.errors
    assert err.target == "lb1" and err.kind == "parse"
    assert err.message.startswith("2 show stat row(s) refused; first: show stat line 5 (be_web/BACKEND)")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_fuzz_show_stat_parser(text: str) -> None:
    try:
        rows = parse_show_stat(text)
    except StatParseError as e:
        assert str(e)
        return
    for r in rows:
        try:
            row_to_metric(r, "lb", 1795310400)
        except ValueError as e:  # WireError: a field the wire format refuses, named in the message
            assert str(e)


@pytest.mark.integration
def test_live_collector_and_runtime_api(lab_edge) -> None:
    lab_edge.start()
    api = HaproxyAPI(lab_edge.admin_socket)
    assert api.get_weight("be_web", "near") == (100, 100)
    api.set_weight("be_web", "near", 37)
    assert api.get_weight("be_web", "near") == (37, 100)
    with pytest.raises(HaproxyError, match="No such server"):
        api.set_weight("be_web", "nope", 5)
    with pytest.raises(HaproxyError, match="outside 0..256"):
        api.set_weight("be_web", "near", 300)
    with pytest.raises(HaproxyError, match="multi-command"):
        api.command("show stat; shutdown frontend fe_web")
    gen = TrafficGenerator(lab_edge.url, 20, workers=4).start()
    try:
        collector = build(Config(instances={"edge1": str(lab_edge.admin_socket), "gone": "/nonexistent.sock"}))
        first = collector.collect()
        assert [e.kind for e in first.errors] == ["unreachable"] and "gone" == first.errors[0].target

        def served() -> bool:
            rnd = collector.collect()
            return sum(m.fields.get("hrsp_2xx", 0) for m in rnd.metrics if m.tags["type"] == "server") > 20

        wait_until(served, timeout=30, what="HTTP responses counted on the servers")
    finally:
        gen.stop()
