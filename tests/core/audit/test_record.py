"""Audit records, the why-query and the CLI's input parsing (no Elasticsearch needed).

Parsers are fuzzed: bad input gives an AuditError/ValueError naming what was wrong, never a crash.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.audit.settings import AuditSettings
from opsloop.audit.trail import AuditLog
from opsloop.records import AuditError, AuditMode, AuditRecord
from opsloop.audit.cli import main as audit_main
from opsloop.audit.indexer import ElasticsearchIndexer
from opsloop.audit.search import parse_duration, parse_time, render, why_query, WhyAnswer
from opsloop.audit.templates import AUDIT_TEMPLATE, load_template
from opsloop.config import ConfigError, Settings, load_settings

T0 = datetime(2026, 11, 22, 3, 12, 4, tzinfo=timezone.utc).timestamp()


def _rec(**over) -> AuditRecord:
    fields = dict(actor="controller.edge", action="edge.weights.push", target="haproxy:ams/app", edge="ams",
                  version=3, before={"eu": 0.9, "us": 0.1}, after={"eu": 0.6, "us": 0.4}, reason="eu hot",
                  mode="live", result="applied", time=T0)
    fields.update(over)
    return AuditRecord.build(**fields)


def test_record_document_matches_the_strict_template_mapping() -> None:
    doc = _rec(labels={"finding": "abc"}).document()
    props = load_template(AUDIT_TEMPLATE)["template"]["mappings"]["properties"]
    assert set(doc) <= set(props), set(doc) - set(props)      # dynamic: strict would refuse anything else
    assert doc["@timestamp"] == "2026-11-22T03:12:04.000Z"
    assert doc["changed"] == ["eu", "us"] and doc["mode"] == "live"


def test_id_is_content_derived_and_changes_with_content() -> None:
    assert _rec().id == _rec().id
    assert _rec().id != _rec(version=4).id != _rec(mode="shadow").id


def test_round_trips() -> None:
    r = _rec(labels={"finding": "f1"})
    assert AuditRecord.decode(r.encode()) == r
    assert AuditRecord.from_document(r.document()) == r


def test_changes_lists_only_what_moved() -> None:
    r = _rec(before={"eu": 0.5, "us": 0.5, "ap": 0.0}, after={"eu": 0.5, "us": 0.3, "ap": 0.2})
    assert r.changes() == {"ap": (0.0, 0.2), "us": (0.5, 0.3)}


def test_secrets_are_masked() -> None:
    r = _rec(labels={"api_key": "k"}, after={"eu": 1.0, "token": "t"})
    assert r.labels["api_key"] == "***" and r.after["token"] == "***"


@pytest.mark.parametrize("over, field", [
    ({"mode": "yolo"}, "mode"), ({"actor": "Controller Edge"}, "actor"), ({"result": ""}, "result"),
    ({"time": 1e12}, "time"), ({"before": {"x": object()}}, "before"), ({"target": ""}, "target"),
])
def test_invalid_records_name_the_field(over: dict, field: str) -> None:
    with pytest.raises(AuditError, match=field):
        _rec(**over)


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
@settings(max_examples=300, deadline=None)
def test_decode_never_crashes(raw: bytes) -> None:
    try:
        AuditRecord.decode(raw)
    except AuditError as e:
        assert str(e).startswith("audit record")


@given(st.dictionaries(st.sampled_from(["actor", "action", "target", "mode", "result", "time", "version", "edge",
                                        "before", "labels", "bogus"]),
                       st.none() | st.integers() | st.floats() | st.text(max_size=20) | st.dictionaries(
                           st.text(max_size=5), st.text(max_size=5), max_size=3), max_size=11))
@settings(max_examples=300, deadline=None)
def test_build_with_arbitrary_fields_raises_only_audit_error(fields: dict) -> None:
    try:
        AuditRecord.build(**fields)
    except AuditError:
        pass


@given(st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_time_and_duration_parsers_fail_cleanly(text: str) -> None:
    for parse in (parse_time, parse_duration):
        try:
            parse(text)
        except ValueError as e:
            assert "--at" in str(e) or "--window" in str(e)


def test_time_and_window_parsing() -> None:
    assert parse_time("2026-11-22T03:12") == datetime(2026, 11, 22, 3, 12, tzinfo=timezone.utc)
    assert parse_time("2026-11-22T04:12+01:00") == datetime(2026, 11, 22, 3, 12, tzinfo=timezone.utc)
    assert parse_duration("10m") == timedelta(minutes=10) and parse_duration("90") == timedelta(seconds=90)
    for bad in ("0m", "86400000000000", "400d"):
        with pytest.raises(ValueError, match="--window"):
            parse_duration(bad)
    with pytest.raises(ValueError, match="year 1999 is outside"):
        parse_time("1999-12-31T23:00")


def test_why_query_covers_the_named_minute_and_the_window_before() -> None:
    q = why_query("ams", parse_time("2026-11-22T03:12:40"), timedelta(minutes=10))
    flt = q["query"]["bool"]["filter"]
    assert flt[0] == {"term": {"edge": "ams"}}
    assert flt[1]["range"]["@timestamp"] == {"gte": "2026-11-22T03:02:00.000Z", "lt": "2026-11-22T03:13:00.000Z"}
    # newest first (printed oldest first): more than MAX_HITS in the window keeps the minute asked about
    assert q["sort"] == [{"@timestamp": "desc"}] and q["track_total_hits"] is True


def test_render_says_what_moved_and_why() -> None:
    start = parse_time("2026-11-22T03:02")
    text = render(WhyAnswer("ams", start, start + timedelta(minutes=11), [_rec()]))
    assert "eu: 0.9 -> 0.6" in text and "why: eu hot" in text and "1 live weight change" in text
    assert "no audit record" in render(WhyAnswer("ams", start, start, []))


def test_cli_bad_input_exit_2_and_show_query(capsys: pytest.CaptureFixture[str]) -> None:
    assert audit_main(["search", "--edge", "ams", "--at", "noon"]) == 2
    assert "--at 'noon'" in capsys.readouterr().err
    assert audit_main(["search", "--edge", "ams", "--at", "2026-11-22T03:12", "--show-query"]) == 0
    assert orjson.loads(capsys.readouterr().out)["query"]["bool"]["filter"][0] == {"term": {"edge": "ams"}}
    with pytest.raises(SystemExit) as e:
        audit_main(["search", "--help"])
    assert e.value.code == 0 and "examples:" in capsys.readouterr().out


def test_settings_section_and_errors() -> None:
    s = load_settings(overrides={"controllers": {"audit": {"elasticsearch_url": "http://127.0.0.1:9",
                                                           "max_buffered": 7}}})
    log = AuditLog.from_settings(s, start=False)
    assert isinstance(log.sinks[0], ElasticsearchIndexer) and log.sinks[0].max_buffered == 7
    # The whole file is validated at load (every section), so a bad audit section stops the start ...
    with pytest.raises(ConfigError, match=r"audit\.max_buffered: Input should be greater than or equal to 1"):
        load_settings(overrides={"audit": {"max_buffered": 0}})
    # ... and settings built in code are still checked where the section is used.
    with pytest.raises(AuditError, match="audit: max_buffered"):
        AuditSettings.from_settings(Settings(audit={"max_buffered": 0}))


def test_a_failing_sink_does_not_fail_the_actuator() -> None:
    class Broken:
        def submit(self, record: AuditRecord) -> None:
            raise RuntimeError("sink bug")

    seen: list[AuditRecord] = []

    class Keep:
        def submit(self, record: AuditRecord) -> None:
            seen.append(record)

    rec = AuditLog([Broken(), Keep()]).record(actor="pager", action="page.fire", target="alert:X", mode="live",
                                             result="sent", time=T0)
    assert seen == [rec] and rec.mode is AuditMode.LIVE
