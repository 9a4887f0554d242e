"""`opsloop logs search` against the real Elasticsearch: units (systemd names, template instances,
containers), "this level or worse" for opsloop's JSON level and for the journal priority of other
services, the time range, and the exit codes an operator's script relies on.

Documents are shaped exactly as the shippers write them (test_logs_journald.py runs the shippers and
the same search on what they delivered); here they are indexed directly so that each case is exact.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from elasticsearch import Elasticsearch

from opsloop.audit.cli import main as audit_main
from opsloop.audit.logs_cli import main as logs_main
from opsloop.stack import free_port
from tests.helpers import REPO, unique

pytestmark = pytest.mark.integration
NOW = datetime(2026, 11, 22, 3, 12, 30, tzinfo=timezone.utc)


def _doc(run: str, rid: str, unit: str, at: datetime, level: str | None, priority: int = 6,
         container: str | None = None) -> dict[str, Any]:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    doc: dict[str, Any] = {"@timestamp": stamp, "syslog": {"identifier": "opsloop", "priority": priority},
                           "systemd": {"unit": unit}}
    if level is None:           # not an opsloop JSON line (Horizon's Apache, a traceback)
        doc["message"] = f"GET /dashboard/ {run} {rid}"
        doc["syslog"]["identifier"] = "horizon-access"
    else:
        line = {"time": stamp, "level": level, "service": "edge", "logger": "opsloop.edge", "event": rid,
                "fields": {"run": run}}
        doc["message"], doc["opsloop"] = orjson.dumps(line).decode(), line
    if container:
        doc["container"] = {"name": container}
    return doc


@pytest.fixture(scope="module")
def indexed(es_url: str) -> str:
    assert audit_main(["install-templates", "--es", es_url]) == 0
    run = unique("ls").replace("-", "")
    m = timedelta(minutes=1)
    docs = [
        _doc(run, "edge_info", "opsloop-edge.service", NOW - 2 * m, "info"),
        _doc(run, "edge_warn", "opsloop-edge.service", NOW - 3 * m, "warning"),
        _doc(run, "edge_err", "opsloop-edge.service", NOW - 1 * m, "error"),
        _doc(run, "edge_old_warn", "opsloop-edge.service", NOW - 30 * m, "warning"),
        _doc(run, "edge_future", "opsloop-edge.service", NOW + 5 * m, "warning"),
        _doc(run, "ipmi_warn", "opsloop-collector@ipmi.service", NOW - 2 * m, "warning"),
        _doc(run, "docker_edge_warn", "docker.service", NOW - 2.5 * m, "warning", container="opsloop-edge"),
        _doc(run, "compose_edge_info", "docker.service", NOW - 2 * m, "info", container="docker-compose-edge-control-1"),
        _doc(run, "compose_other_info", "docker.service", NOW - 2 * m, "info", container="docker-compose-edge-control2-1"),
        _doc(run, "apache_notice", "apache2.service", NOW - 2 * m, None, priority=5),
        _doc(run, "apache_err", "apache2.service", NOW - 2 * m, None, priority=3),
    ]
    es = Elasticsearch(es_url)
    index = f"opsloop-logs-{run}"
    for d in docs:
        es.index(index=index, document=d)
    es.indices.refresh(index=index)
    return run


def _search(es_url: str, run: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = logs_main(["search", "--es", es_url, "--until", NOW.isoformat(), "--grep", run, "--json", *args])
    docs = [orjson.loads(x) for x in capsys.readouterr().out.splitlines()]
    return code, [d["opsloop"]["event"] if "opsloop" in d else d["message"].rsplit(" ", 1)[1] for d in docs]


def test_the_documented_search(es_url: str, indexed: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--unit opsloop-edge --since 10m --level warning`: the unit and its container, warning or worse, oldest first."""
    code, got = _search(es_url, indexed, capsys, "--unit", "opsloop-edge", "--since", "10m", "--level", "warning")
    assert code == 0 and got == ["edge_warn", "docker_edge_warn", "edge_err"]


def test_units_by_full_name_and_template_instance(es_url: str, indexed: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _search(es_url, indexed, capsys, "--unit", "opsloop-collector@ipmi", "--since", "1h")[1] == ["ipmi_warn"]
    assert _search(es_url, indexed, capsys, "--unit", "opsloop-collector", "--since", "1h")[1] == ["ipmi_warn"]
    assert _search(es_url, indexed, capsys, "--unit", "opsloop-edge.service", "--since", "10m")[1] == \
        ["edge_warn", "edge_info", "edge_err"]
    # Compose names the containers <project>-<service>-<n> (v1: _ instead of -)
    assert _search(es_url, indexed, capsys, "--unit", "edge-control", "--since", "10m")[1] == ["compose_edge_info"]
    two = _search(es_url, indexed, capsys, "--unit", "opsloop-collector@ipmi", "--unit", "apache2", "--since", "10m")
    assert sorted(two[1]) == ["apache_err", "apache_notice", "ipmi_warn"]


def test_level_uses_the_journal_priority_for_lines_that_are_not_opsloop_json(
        es_url: str, indexed: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _search(es_url, indexed, capsys, "--unit", "apache2", "--since", "10m", "--level", "warning")[1] == \
        ["apache_err"]
    assert sorted(_search(es_url, indexed, capsys, "--unit", "apache2", "--since", "10m", "--level", "info")[1]) == \
        ["apache_err", "apache_notice"]


def test_time_range_and_limit(es_url: str, indexed: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, got = _search(es_url, indexed, capsys, "--unit", "opsloop-edge", "--since", "1h", "--level", "warning")
    assert code == 0 and got == ["edge_old_warn", "edge_warn", "docker_edge_warn", "edge_err"]   # not the future one
    assert _search(es_url, indexed, capsys, "--unit", "opsloop-edge", "--since", "1h", "--limit", "2")[1] == \
        ["edge_info", "edge_err"]                                                                  # the newest two


def test_human_output_and_exit_codes(es_url: str, indexed: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert logs_main(["search", "--es", es_url, "--until", NOW.isoformat(), "--grep", indexed,
                      "--unit", "opsloop-edge", "--since", "10m", "--level", "error"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "error" in out[0] and "opsloop-edge.service" in out[0] and "edge: edge_err" in out[0]
    # nothing matched: 1, and says so
    assert logs_main(["search", "--es", es_url, "--until", NOW.isoformat(), "--grep", indexed,
                      "--unit", "opsloop-nothing", "--since", "10m"]) == 1
    assert "no log line matched" in capsys.readouterr().err
    # bad input: 2 with the flag named
    assert logs_main(["search", "--es", es_url, "--since", "ten minutes"]) == 2
    assert "--since 'ten minutes'" in capsys.readouterr().err
    assert logs_main(["search", "--es", es_url, "--until", "yesterday"]) == 2
    assert "--until 'yesterday'" in capsys.readouterr().err


def test_an_unreachable_elasticsearch_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert logs_main(["search", "--es", url, "--unit", "opsloop-edge"]) == 2
    err = capsys.readouterr().err
    assert url in err and "Connection" in err


def test_help_has_the_documented_example() -> None:
    r = subprocess.run([sys.executable, "-m", "opsloop.cli", "logs", "search", "--help"], capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0 and "opsloop logs search --unit opsloop-edge --since 10m --level warning" in r.stdout
