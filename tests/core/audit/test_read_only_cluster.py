"""The audit indexer against a real Elasticsearch whose indices are blocked for writes.

Past the flood-stage disk watermark Elasticsearch puts ``index.blocks.read_only_allow_delete`` on every
index: each document of a bulk answers 429 ``cluster_block_exception``; a read-only or write block set by
hand answers 403. Neither is the record's fault: the records are kept (not rejected), the failures counted,
and they all go in once the block is lifted. What an operator is told meanwhile is the alert
``OpsloopAuditIndexStalled`` (alerts/rules/pipeline.yml; promtool case in alerts/tests/pipeline_test.yml),
which reads exactly the two series checked here: the buffer never empty, the bulk failures rising.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from elasticsearch import Elasticsearch
from prometheus_client import REGISTRY

from opsloop.audit.indexer import ElasticsearchIndexer, client_for
from opsloop.audit.trail import AuditLog
from tests.helpers import unique, wait_until

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 22, 3, 12, tzinfo=timezone.utc).timestamp()


def _metric(name: str, stream: str) -> float:
    return REGISTRY.get_sample_value(name, {"stream": stream}) or 0.0


@pytest.mark.parametrize("block", ["index.blocks.read_only_allow_delete", "index.blocks.write"])
def test_a_blocked_index_keeps_the_records_counts_the_failures_and_takes_them_when_lifted(
        es_url: str, block: str) -> None:
    stream = unique("opsloop-audit-blocked")
    es = Elasticsearch(es_url)
    indexer = ElasticsearchIndexer(client_for(es_url, request_timeout_s=10), stream, bulk_retries=1,
                                   initial_backoff_s=0.05, max_backoff_s=0.2, flush_interval_s=0.05).start()
    audit = AuditLog([indexer])

    def push(v: int) -> str:
        return audit.record(actor="actuator.haproxy", action="edge.weights.apply", target="haproxy:ams/app",
                            edge="ams", listener="app", version=v, before={"eu": 1.0}, after={"eu": 0.5, "us": 0.5},
                            reason=f"r{v}", mode="live", result="applied", time=T0 + v).id

    try:
        first = push(0)
        wait_until(lambda: REGISTRY.get_sample_value("opsloop_audit_records_total",
                                                     {"stream": stream, "outcome": "indexed"}) == 1,
                   timeout=30, what="first record indexed (the stream exists)")
        es.indices.put_settings(index=stream, settings={block: True})
        failures = _metric("opsloop_audit_bulk_failures_total", stream)
        ids = [push(v) for v in range(1, 6)]
        wait_until(lambda: _metric("opsloop_audit_bulk_failures_total", stream) >= failures + 3, timeout=60,
                   what="bulk requests failing on the block")
        assert sorted(indexer.pending_ids()) == sorted(ids)                    # kept, none rejected
        assert REGISTRY.get_sample_value("opsloop_audit_buffered_records", {"stream": stream}) == 5
        assert (REGISTRY.get_sample_value("opsloop_audit_records_total", {"stream": stream, "outcome": "rejected"})
                or 0.0) == 0
        assert _metric("opsloop_audit_dropped_total", stream) == 0

        es.indices.put_settings(index=stream, settings={block: None})         # disk freed, block lifted
        wait_until(lambda: indexer.buffered == 0, timeout=60, what="buffer drained after the block")
        es.indices.refresh(index=stream)
        stored = {h["_id"] for h in es.search(index=stream, size=10, query={"match_all": {}})["hits"]["hits"]}
        assert stored == {first, *ids}
    finally:
        indexer.close(timeout_s=5)
