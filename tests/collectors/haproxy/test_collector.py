"""HAProxy collector and runtime API: recorded output, fuzzed parser, and the real HAProxy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.collectors.haproxy import Config, build
from opsloop.collectors.haproxy.collector import row_to_metric
from opsloop.lb.haproxy import HaproxyAPI, HaproxyError, StatParseError, parse_show_stat
from opsloop.lab.traffic import TrafficGenerator
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
    ("", "header"), ("hello", "header"), ("# foo,bar\n1,2\n", "pxname,svname"), ("# pxname,svname,x\na\n", "line 2"),
])
def test_bad_show_stat_is_a_clear_error(text: str, needle: str) -> None:
    with pytest.raises(StatParseError, match=needle):
        parse_show_stat(text)


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
