"""The log index template Filebeat installs (opsloop/audit/templates/logs.json), in a real Elasticsearch.

The mapping on its own, installed by `opsloop audit install-templates` (the shippers install the same
file themselves: test_logs_journald.py). Documents shaped the way docker-compose/filebeat.yml ships
real opsloop JSON log lines (opsloop.log) go to an opsloop-logs-* index, and an operator's queries
(by service, level, event and a field value) find them, including a field that is a number in one
line and a string in another.
"""

from __future__ import annotations

import io
import logging

import orjson
import pytest
from elasticsearch import Elasticsearch

from opsloop.audit.cli import main as audit_main
from opsloop.log import JsonFormatter, get_logger
from tests.helpers import unique

pytestmark = pytest.mark.integration


def _log_lines(service: str) -> list[str]:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"opsloop.{service}")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        log = get_logger(service)
        log.info("round_done", collector="ipmi", samples=12, errors=0)
        log.warning("bmc_timeout", host="stor-g3-17", timeout_s=6.0, password="hunter2")
        log.info("round_done", collector="ipmi", samples="n/a")     # same field, another type
    finally:
        logger.removeHandler(handler)
    return buf.getvalue().splitlines()


def _as_filebeat_would_ship(line: str) -> dict:
    decoded = orjson.loads(line)
    return {"@timestamp": decoded["time"], "message": line, "opsloop": decoded,
            "journald": {"custom": {"syslog_identifier": "opsloop"}}, "container": {"name": "collector-ipmi"}}


def test_logs_template_indexes_and_finds_opsloop_log_lines(es_url: str) -> None:
    assert audit_main(["install-templates", "--es", es_url]) == 0
    es = Elasticsearch(es_url)
    service = unique("svc")
    index = f"opsloop-logs-{unique('t')}"
    lines = _log_lines(service)
    assert len(lines) == 3 and "hunter2" not in "".join(lines)         # secrets never reach the logs
    for line in lines:
        es.index(index=index, document=_as_filebeat_would_ship(line))
    es.indices.refresh(index=index)

    mapping = es.indices.get_mapping(index=index)[index]["mappings"]["properties"]["opsloop"]["properties"]
    assert mapping["event"]["type"] == "keyword" and mapping["time"]["type"] == "date"
    assert mapping["fields"]["properties"]["samples"]["type"] == "keyword"   # 12 and "n/a" both fit

    def hits(query: dict) -> int:
        return int(es.count(index=index, query=query)["count"])

    assert hits({"term": {"opsloop.level": "warning"}}) == 1
    assert hits({"term": {"opsloop.event": "round_done"}}) == 2
    assert hits({"term": {"opsloop.fields.host": "stor-g3-17"}}) == 1
    assert hits({"term": {"opsloop.fields.password": "***"}}) == 1
    assert hits({"range": {"opsloop.time": {"gte": "now-1h"}}}) == 3
    assert hits({"term": {"opsloop.logger": f"opsloop.{service}"}}) == 3
