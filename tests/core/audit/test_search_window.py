"""`opsloop audit search` over a window holding more records than one answer carries (real Elasticsearch).

A controller audits every decision of every listener (applied, held, unchanged in shadow): four listeners
at the default 15 s interval write 200 records in 12.5 minutes, so `--window 30m` (the documented example)
often matches more than the 200 records an answer carries. Before, the query sorted oldest first: the
answer was the window's first 200 records, the minute asked about was cut off and nothing said so.
"""

from __future__ import annotations

from datetime import datetime, timezone

import orjson
import pytest
from elasticsearch import Elasticsearch

from opsloop.audit.cli import main as audit_main
from opsloop.audit.indexer import ElasticsearchIndexer, client_for
from opsloop.audit.search import MAX_HITS, parse_time, why_weights_changed
from opsloop.audit.trail import AuditLog
from tests.helpers import unique

pytestmark = pytest.mark.integration

START = datetime(2026, 11, 22, 3, 2, tzinfo=timezone.utc).timestamp()   # the window of --at 03:12, 10m
STEP_S = 2.5
N = 260          # 03:02:00 .. 03:12:47.5; the last 20 fall in the minute asked about (03:12)


def test_a_window_with_more_records_than_an_answer_keeps_the_minute_asked_about(
        es_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    stream, edge = unique("opsloop-audit-many"), unique("ams")
    indexer = ElasticsearchIndexer(client_for(es_url), stream)
    audit = AuditLog([indexer])
    for i in range(N):
        audit.record(actor="actuator.haproxy", action="edge.weights.apply", target=f"haproxy:{edge}/app", edge=edge,
                     listener="app", version=i, before={"eu": 1.0}, after={"eu": 1.0}, reason=f"decision {i}",
                     mode="shadow", result="unchanged", time=START + i * STEP_S)
    assert indexer.flush_all().indexed == N
    es = Elasticsearch(es_url)
    es.indices.refresh(index=stream)

    answer = why_weights_changed(es, edge, parse_time("2026-11-22T03:12"), index=stream)
    versions = [int(r.version) for r in answer.records if r.version is not None]
    assert versions == list(range(N - MAX_HITS, N)), versions[:3]      # the newest 200, printed oldest first
    assert answer.total == N and answer.left_out == N - MAX_HITS

    assert audit_main(["search", "--es", es_url, "--index", stream, "--edge", edge, "--at", "2026-11-22T03:12"]) == 0
    out = capsys.readouterr().out
    assert f"decision {N - 1}" in out and "decision 59\n" not in out
    assert f"the newest {MAX_HITS} of {N}: {N - MAX_HITS} earlier record(s) left out" in out

    assert audit_main(["search", "--es", es_url, "--index", stream, "--edge", edge, "--at", "2026-11-22T03:12",
                       "--json"]) == 0
    got = capsys.readouterr()
    assert [orjson.loads(line)["reason"] for line in got.out.splitlines()][-1] == f"decision {N - 1}"
    assert f"{N - MAX_HITS} earlier ones left out" in got.err

    # The earlier records are there for an earlier --at: nothing is lost, only left out of one answer.
    earlier = why_weights_changed(es, edge, parse_time("2026-11-22T03:04"), index=stream)
    assert [r.reason for r in earlier.records][-1] == "decision 71"    # 03:04:57.5, the last before 03:05
    assert earlier.left_out == 0


def test_a_document_this_version_cannot_read_does_not_hide_the_others(
        es_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, one unreadable hit (a newer writer's mode, a document made by hand or by another indexer off the
    audit topic) failed the whole search: exit 2 and not one of the good records shown."""
    stream, edge = unique("opsloop-audit-odd"), unique("ams")
    indexer = ElasticsearchIndexer(client_for(es_url), stream)
    audit = AuditLog([indexer])
    good = [audit.record(actor="actuator.haproxy", action="edge.weights.apply", target=f"haproxy:{edge}/app",
                         edge=edge, listener="app", version=v, before={"eu": 1.0}, after={"eu": 0.5, "us": 0.5},
                         reason=f"shed {v}", mode="live", result="applied", time=START + 60 * v) for v in (1, 3)]
    assert indexer.flush_all().indexed == 2
    es = Elasticsearch(es_url)
    odd = {**good[0].document(), "version": "2", "mode": "canary", "reason": "written by a newer opsloop",
           "@timestamp": "2026-11-22T03:04:00.000Z"}
    es.index(index=stream, id="odd-1", document=odd, op_type="create", refresh=True)

    answer = why_weights_changed(es, edge, parse_time("2026-11-22T03:12"), index=stream)
    assert [r.reason for r in answer.records] == ["shed 1", "shed 3"]
    assert len(answer.unreadable) == 1 and answer.unreadable[0].startswith("odd-1: ") \
        and "canary" in answer.unreadable[0]
    assert answer.left_out == 0

    assert audit_main(["search", "--es", es_url, "--index", stream, "--edge", edge, "--at", "2026-11-22T03:12"]) == 0
    out = capsys.readouterr().out
    assert "shed 1" in out and "shed 3" in out
    assert "1 document(s) not readable as audit records (skipped):" in out and "odd-1: " in out
    assert audit_main(["search", "--es", es_url, "--index", stream, "--edge", edge, "--at", "2026-11-22T03:12",
                       "--json"]) == 0
    got = capsys.readouterr()
    assert len(got.out.splitlines()) == 2 and "skipped a document that is not a valid audit record: odd-1" in got.err
    # only the unreadable one in the window: not "nothing happened", exit 2
    assert audit_main(["search", "--es", es_url, "--index", stream, "--edge", edge, "--at", "2026-11-22T03:04",
                       "--window", "30s"]) == 2
    assert "no readable audit record" in capsys.readouterr().out
