"""journald -> Filebeat / Journalbeat -> Elasticsearch, with the very config files that ship.

Real parts: journal files written by systemd-journal-remote (the journal's own file format), Filebeat
7.17.29 built with the journald input and Journalbeat 7.15.2 (setup.d/80-beats.sh), the test
Elasticsearch 8.19. The configs are docker-compose/filebeat.yml and docker-compose/journalbeat.yml as
committed; only paths and hosts are overridden (-E path.*, the input's paths, the template file's
path; ELASTICSEARCH_HOSTS). Test-only: HAProxy in front of Elasticsearch answers Beats' first
``GET /``, which the integ-test Elasticsearch build answers 405 (a real cluster answers it; see
tests/core/audit/beats.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
import requests

from opsloop.audit.logs_cli import main as logs_main
from tests.helpers import unique
from tests.core.audit.beats import (COMPOSE_DIR, LOGS_TEMPLATE_FILE, Journal, Scenario, ShipperRun, beat_process,
                                       es_front, ship_across_a_restart)

pytestmark = pytest.mark.integration


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _realtime(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, timezone.utc)


def _by_id(run: ShipperRun) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for d in run.docs:
        for rid in run.scenario.ids([d]):
            out[rid] = d
    return out


@pytest.fixture(scope="module", params=["filebeat", "journalbeat"])
def shipped(request: pytest.FixtureRequest, es_url: str, tmp_path_factory: pytest.TempPathFactory) -> ShipperRun:
    """One shipper through the whole scenario (tests/core/audit/beats.py), with its shipped config."""
    beat = str(request.param)
    work = tmp_path_factory.mktemp(beat)
    front, front_url = es_front(work / "front", es_url)
    front.start()
    try:
        # The shipper must install the template itself (404 when absent is fine).
        requests.delete(f"{es_url}/_index_template/opsloop-logs", timeout=30)
        journal = Journal(work / "journal")
        proc = beat_process(beat, COMPOSE_DIR / f"{beat}.yml", work / beat, front_url, [
            f'{beat}.inputs.0.paths=["{journal.folder}"]', f"setup.template.json.path={LOGS_TEMPLATE_FILE}"])
        return ship_across_a_restart(proc, journal, es_url, unique(beat[:2]).replace("-", ""))
    finally:
        front.stop()


def test_every_matched_line_arrives_exactly_once_across_a_restart(shipped: ShipperRun) -> None:
    counts = shipped.scenario.ids(shipped.docs)
    assert shipped.expected and all(counts[rid] == 1 for rid in shipped.expected), \
        {rid: counts[rid] for rid in shipped.expected if counts[rid] != 1}


def test_only_the_matched_units_arrive(shipped: ShipperRun) -> None:
    counts = shipped.scenario.ids(shipped.docs)
    assert not {rid for rid in shipped.unexpected if counts[rid]}, "cron/sshd lines were shipped"
    units = {d["systemd"]["unit"] for d in shipped.docs}
    assert units == {"opsloop-edge.service", "opsloop-collector@ipmi.service", "apache2.service",
                     "opsloop-probe.service"}


def test_a_first_start_does_not_replay_the_journal(shipped: ShipperRun) -> None:
    """cursor_seek_fallback: tail. Both Beats seek to the tail and then step once, which ships the last
    matched line already in the journal (seen with the real binaries); nothing older."""
    counts = shipped.scenario.ids(shipped.docs)
    *older, last = shipped.before_start
    assert older and not {rid for rid in older if counts[rid]}
    assert counts[last] <= 1


def test_opsloop_json_is_decoded_and_the_event_time_is_the_document_time(shipped: ShipperRun) -> None:
    docs = _by_id(shipped)
    opsloop = [(rid, e) for rid, e in shipped.expected.items() if e.message.startswith("{")]
    assert len(opsloop) >= 8
    for rid, entry in opsloop:
        doc, line = docs[rid], orjson.loads(entry.message)
        assert doc["opsloop"]["event"] == line["event"] and doc["opsloop"]["level"] == line["level"]
        assert doc["opsloop"]["service"] == line["service"] and doc["opsloop"]["fields"]["id"] == rid
        assert "error" not in doc
        assert _ts(doc["@timestamp"]) == _ts(line["time"])
        # ... which is not the journal's receive time (the line was made before the journal got it).
        assert _realtime(entry.realtime_us) - _ts(doc["@timestamp"]) > timedelta(seconds=Scenario.APP_TO_JOURNAL_S / 2)
        assert doc["syslog"]["identifier"] == "opsloop" and doc["syslog"]["priority"] == entry.priority
        assert doc["systemd"]["unit"] == entry.unit


def test_horizon_access_lines_keep_the_journal_time_and_are_parsed(shipped: ShipperRun) -> None:
    docs = _by_id(shipped)
    horizon = [(rid, e) for rid, e in shipped.expected.items() if e.unit == "apache2.service"]
    assert len(horizon) >= 3
    for rid, entry in horizon:
        doc = docs[rid]
        assert doc["message"] == entry.message and "opsloop" not in doc and "error" not in doc
        assert doc["syslog"]["identifier"] == "horizon-access" and doc["syslog"]["priority"] == 6
        assert abs(_ts(doc["@timestamp"]) - _realtime(entry.realtime_us)) < timedelta(milliseconds=1)
        # the access line's parts, for searches such as Horizon's 5xx
        assert doc["http"]["request"]["method"] == "GET" and doc["http"]["response"]["status_code"] == "200"
        assert doc["source"]["address"] == "10.20.0.5" and doc["url"]["original"].endswith(f"id={rid}")


def test_a_line_that_is_not_json_is_shipped_undecoded(shipped: ShipperRun) -> None:
    docs = _by_id(shipped)
    bad = [(rid, e) for rid, e in shipped.expected.items() if e.message.startswith("Traceback")]
    assert len(bad) == 1
    doc = docs[bad[0][0]]
    assert doc["message"] == bad[0][1].message and doc["syslog"]["priority"] == 3 and "opsloop" not in doc
    if shipped.beat == "filebeat":      # Journalbeat 7.15's decode_json_fields leaves no error key
        assert "decoding" in str(doc["error"]["message"]).lower() or "json" in str(doc["error"]["message"]).lower()


def test_our_index_template_is_the_one_loaded(shipped: ShipperRun, es_url: str) -> None:
    """Beats' default template fails on Elasticsearch 8; the shipped config loads the repository's."""
    ours = orjson.loads(LOGS_TEMPLATE_FILE.read_bytes())
    loaded = requests.get(f"{es_url}/_index_template/opsloop-logs", timeout=10).json()["index_templates"]
    assert [t["index_template"]["_meta"] for t in loaded] == [ours["_meta"]]
    index = "opsloop-logs-" + _ts(shipped.docs[-1]["@timestamp"]).strftime("%Y.%m.%d")
    props = requests.get(f"{es_url}/{index}/_mapping", timeout=10).json()[index]["mappings"]["properties"][
        "opsloop"]["properties"]
    assert props["fields"]["properties"]["id"]["type"] == "keyword" and props["time"]["type"] == "date"


def test_logs_search_finds_the_shipped_warnings_of_a_unit(shipped: ShipperRun, es_url: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The operator's question on what was shipped: `opsloop logs search --unit opsloop-edge --level warning`."""
    run = shipped.scenario.run
    # opsloop's warnings by their JSON level; the traceback that is not JSON by its journal priority (3)
    want = {rid for rid, e in shipped.expected.items()
            if e.unit == "opsloop-edge.service" and ('"level":"warning"' in e.message or e.priority <= 4)}
    assert len(want) >= 4
    assert logs_main(["search", "--es", es_url, "--unit", "opsloop-edge", "--since", "1h", "--level", "warning",
                      "--grep", run, "--json"]) == 0
    got = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert set(shipped.scenario.ids(got)) == want and len(got) == len(want)
    # errors of the IPMI collector are "warning or worse" too, but another unit
    assert logs_main(["search", "--es", es_url, "--unit", "opsloop-collector@ipmi", "--since", "1h",
                      "--level", "error", "--grep", run]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == sum(1 for e in shipped.expected.values() if e.unit == "opsloop-collector@ipmi.service")
    assert all("bmc_timeout" in line and "opsloop-collector@ipmi.service" in line for line in out)

