"""Game-day faults on the log path, in the real Elasticsearch (and the real shippers, test_logs_json_text.py).

* a clock step: lines stamped ahead of the searcher's clock (the host's clock was ahead, then NTP stepped it
  back; or a container's clock drifts) are the newest lines and must be found by a plain
  ``opsloop logs search --since 10m``; before, the range ended at "now" and they were invisible until the
  wall clock caught up — the incident's own lines, for as long as the clock had been ahead;
* a field of ``opsloop.fields`` that is an object in one line and a plain value in another (``error=str``
  here, ``error={...}`` there; a library's dict): before, Elasticsearch refused the second kind for the rest
  of the day's index (400 ``mapper_parsing_exception``) and the shipper dropped those lines for good.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from elasticsearch import Elasticsearch

from opsloop.audit.cli import main as audit_main
from opsloop.audit.logs_cli import main as logs_main
from tests.core.audit.test_logs_template import _as_filebeat_would_ship
from tests.helpers import unique

pytestmark = pytest.mark.integration


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _line(at: datetime, event: str, **fields: Any) -> str:
    return orjson.dumps({"time": _stamp(at), "level": "warning", "service": "edge", "logger": "opsloop.edge",
                         "event": event, "fields": fields}).decode()


def _shipped(line: str, unit: str) -> dict[str, Any]:
    doc = _as_filebeat_would_ship(line)
    doc["systemd"] = {"unit": unit}
    return doc


def test_lines_stamped_ahead_of_the_clock_are_found_by_a_search_up_to_now(
        es_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert audit_main(["install-templates", "--es", es_url]) == 0
    capsys.readouterr()
    es = Elasticsearch(es_url)
    index, unit = f"opsloop-logs-{unique('clk')}", unique("opsloop-clk")
    now = datetime.now(timezone.utc)
    for event, at in (("before_the_step", now - timedelta(minutes=2)),
                      ("ahead_of_the_clock", now + timedelta(hours=1))):
        es.index(index=index, document=_shipped(_line(at, event), unit), refresh="wait_for")

    rc = logs_main(["search", "--es", es_url, "--index", index, "--unit", unit, "--since", "10m", "--json"])
    out, err = capsys.readouterr()
    events = [orjson.loads(line)["opsloop"]["event"] for line in out.splitlines()]
    assert rc == 0 and events == ["before_the_step", "ahead_of_the_clock"], (events, err)
    assert "1 line(s) stamped after now" in err          # said: the shipper's host clock is ahead

    # an explicit --until is a closed range, as asked
    until = _stamp(now + timedelta(minutes=1))
    assert logs_main(["search", "--es", es_url, "--index", index, "--unit", unit, "--since", "10m", "--json",
                      "--until", until]) == 0
    out, _ = capsys.readouterr()
    assert [orjson.loads(line)["opsloop"]["event"] for line in out.splitlines()] == ["before_the_step"]


def test_a_field_that_is_an_object_in_one_line_and_a_value_in_another_is_indexed_both_ways(es_url: str) -> None:
    assert audit_main(["install-templates", "--es", es_url]) == 0
    es = Elasticsearch(es_url)
    index, unit = f"opsloop-logs-{unique('obj')}", unique("opsloop-obj")
    now = datetime.now(timezone.utc)
    lines = [_line(now, "sink_failed", error={"type": "timeout", "after_s": 6}, host="es1"),
             _line(now, "sink_failed", error="connection refused", host={"name": "es2", "port": 9200}),
             _line(now, "sink_failed", error=[{"type": "a"}, {"type": "b"}], host="es3")]
    for line in lines:   # old template: BadRequestError 400 (object mapping vs concrete value) for the 2nd
        es.index(index=index, document=_shipped(line, unit))
    es.indices.refresh(index=index)

    def hits(query: dict[str, Any]) -> int:
        return int(es.count(index=index, query=query)["count"])

    assert hits({"term": {"opsloop.event": "sink_failed"}}) == 3
    assert hits({"term": {"opsloop.fields.error": "connection refused"}}) == 1
    assert hits({"term": {"opsloop.fields.error.type": "timeout"}}) == 1
    assert hits({"term": {"opsloop.fields.error.type": "b"}}) == 1
    assert hits({"term": {"opsloop.fields.host.name": "es2"}}) == 1
    assert hits({"term": {"opsloop.fields.host": "es3"}}) == 1
