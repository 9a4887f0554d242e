"""A record Elasticsearch refuses for good is dropped (counted, alerted) — and its content is kept in the log.

A 400 (the document refused by the strict mapping: a newer writer's field, a bug) cannot be retried into the
stream, so the indexer drops it and goes on with the others. Before, the rejection line carried the record's id
and the reason only: the weights before and after, the labels and the error of that action were gone for good
(the ``audit`` log line of the trail has neither). Now the rejection line carries the record's JSON (bounded),
readable in the journal and in ``opsloop logs search``, and decodable into the record to index it by hand.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Iterator

import orjson
import pytest

from opsloop.audit.indexer import ElasticsearchIndexer, client_for
from opsloop.audit.trail import AuditLog
from opsloop.log import JsonFormatter
from opsloop.records import AuditRecord
from tests.helpers import unique

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 22, 3, 12, 4, tzinfo=timezone.utc).timestamp()


class Lines(logging.Handler):
    """The indexer's lines as the service writes them (the real formatter), decoded."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.docs: list[dict[str, Any]] = []
        self.sizes: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = JsonFormatter().format(record)
        self.docs.append(orjson.loads(line))
        self.sizes.append(len(line.encode()))


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler, logger = Lines(), logging.getLogger("opsloop.audit.indexer")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


class Corrupting(ElasticsearchIndexer):
    """Adds a field the strict mapping refuses to the documents of version 2 (a newer writer's field)."""

    def _actions(self, batch: list[AuditRecord]) -> Iterator[dict[str, Any]]:
        for action in super()._actions(batch):
            if action["_source"]["version"] == 2:
                action["_source"]["unmapped_field"] = "x"
            yield action


def _push(audit: AuditLog, version: int, after: dict[str, Any], t: float) -> AuditRecord:
    return audit.record(actor="controller.edge", action="edge.weights.push", target="haproxy:ams/app", edge="ams",
                        listener="app", version=version, before={"eu": 1.0}, after=after,
                        reason=f"v{version}", mode="live", result="applied", time=t,
                        labels={"finding": f"f-{version}"})


def test_a_rejected_record_is_logged_whole_and_can_be_read_back(es_url: str, lines: Lines) -> None:
    indexer = Corrupting(client_for(es_url), unique("opsloop-audit-dl"))
    audit = AuditLog([indexer])
    recs = [_push(audit, v, {"eu": 0.5, "us": 0.5}, T0 + v) for v in (1, 2, 3)]
    big = _push(audit, 2, {f"origin-{i:04d}": 0.001 for i in range(1000)}, T0 + 10)   # rejected, too big to log whole
    assert len(big.encode()) > 12 * 1024                           # DEAD_LETTER_BYTES

    result = indexer.flush_all()
    assert (result.indexed, result.rejected, result.remaining) == (2, 2, 0)
    rejected = {d["fields"]["id"]: d["fields"] for d in lines.docs if d["event"] == "audit_record_rejected"}
    assert set(rejected) == {recs[1].id, big.id}

    small = rejected[recs[1].id]
    assert "strict_dynamic_mapping_exception" in small["reason"]
    assert AuditRecord.decode(small["record"]) == recs[1]           # the whole record: before, after, labels
    bounded = rejected[big.id]
    assert "record" not in bounded and bounded["record_bytes"] == len(big.encode())
    assert (bounded["action"], bounded["target"], bounded["version"]) == (big.action, big.target, 2)
    assert max(lines.sizes) < 16 * 1024       # whole lines in the journal (Docker splits at 16 KiB)
