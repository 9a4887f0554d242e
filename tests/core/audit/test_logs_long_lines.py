"""A long log line in the log index template (opsloop/audit/templates/logs.json), in a real Elasticsearch.

opsloop's JSON formatter puts a library logger's whole message in ``event`` (``record.getMessage()``:
Faust's partition tables, a client's repr of every assigned partition, an exception text quoted in a
warning). journald keeps a line up to 48 KiB whole (``LineMax``), and Filebeat decodes it into
``opsloop.event``. A keyword longer than 32766 bytes is refused by Lucene, so before, Elasticsearch answered
400 for the document and Filebeat dropped the line for good (it does not retry a 400): the longest, most
detailed warning of an incident was the one line missing. Now the long value is kept in the document and the
message text, only left out of the keyword index (``ignore_above``).
"""

from __future__ import annotations

import io
import logging

import pytest
from elasticsearch import Elasticsearch

from opsloop.audit.cli import main as audit_main
from opsloop.log import JsonFormatter
from tests.core.audit.test_logs_template import _as_filebeat_would_ship
from tests.helpers import unique

pytestmark = pytest.mark.integration


def _library_line(logger_name: str, message: str) -> str:
    """One line as a service writes it for a library's log call (the real formatter)."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        logger.warning("Revoked partitions: %s", message)
    finally:
        logger.removeHandler(handler)
    (line,) = buf.getvalue().splitlines()
    return line


def test_a_library_line_longer_than_a_keyword_is_indexed_not_refused(es_url: str) -> None:
    assert audit_main(["install-templates", "--es", es_url]) == 0
    es = Elasticsearch(es_url)
    index = f"opsloop-logs-{unique('long')}"
    marker = unique("tp")
    partitions = ", ".join(f"TopicPartition(topic='opsloop.telemetry.{marker}', partition={p})" for p in range(600))
    line = _library_line(f"faust.{marker}", partitions)
    assert 32766 < len(line.encode()) < 48 * 1024          # over a keyword's limit, under journald's LineMax
    short = _library_line(f"faust.{marker}", "none")

    for doc in (_as_filebeat_would_ship(line), _as_filebeat_would_ship(short)):
        es.index(index=index, document=doc)               # old template: BadRequestError 400 for the long one
    es.indices.refresh(index=index)

    def hits(query: dict) -> int:
        return int(es.count(index=index, query=query)["count"])

    assert hits({"term": {"opsloop.logger": f"faust.{marker}"}}) == 2
    assert hits({"match_phrase": {"message": f"opsloop.telemetry.{marker}"}}) == 1   # the long one, by its text
    assert hits({"term": {"opsloop.event": "Revoked partitions: none"}}) == 1         # short events stay keywords
