"""The audit trail against a real Elasticsearch (and the real Kafka of the stack fixture).

Elasticsearch "down" is a real outage seen through a real TCP proxy (socat) in front of the node:
stopping the proxy makes every request fail with connection refused, restarting it on the same
port brings Elasticsearch back, without waiting a minute for the node itself to restart.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import orjson
import pytest
from elasticsearch import Elasticsearch
from prometheus_client import REGISTRY

from opsloop.audit.trail import AuditLog
from opsloop.audit.indexer import TEMPLATE_CHECK_S, ElasticsearchIndexer, client_for
from opsloop.audit.kafka import KafkaAuditPublisher
from opsloop.audit.search import parse_time, render, why_weights_changed
from opsloop.audit.templates import AUDIT_TEMPLATE, install_template, load_template
from opsloop.stack import ManagedProcess, free_port
from opsloop.topics import Topic
from tests.helpers import REPO, read_topic, unique, wait_until

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 22, 3, 12, 4, tzinfo=timezone.utc).timestamp()


def audit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`opsloop audit ...` (the module's main; the lead wires it into the `opsloop` command)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "opsloop.audit.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=env)


def _tcp_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Proxy:
    """socat forwarding 127.0.0.1:port -> Elasticsearch; stop() is an outage, start() the recovery."""

    def __init__(self, workdir: Path, es_port: int) -> None:
        self.port = free_port()
        socat = shutil.which("socat")
        assert socat, "socat missing: make setup"
        self.proc = ManagedProcess(
            name="es-proxy", workdir=workdir,
            argv=[socat, f"TCP-LISTEN:{self.port},bind=127.0.0.1,reuseaddr,fork", f"TCP:127.0.0.1:{es_port}"],
            ports={"listen": ("127.0.0.1", self.port)}, ready=lambda: _tcp_open(self.port), ready_timeout_s=20)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc.start()

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture
def proxy(es_url: str, tmp_path: Path) -> Iterator[Proxy]:
    p = Proxy(tmp_path / "proxy", int(es_url.rsplit(":", 1)[1]))
    p.start()
    try:
        yield p
    finally:
        p.stop()


def _push(audit: AuditLog, edge: str, t: float, version: int, before: dict, after: dict, reason: str,
          mode: str = "live", result: str = "applied"):
    return audit.record(actor="controller.edge", action="edge.weights.push", target=f"haproxy:{edge}/app",
                        edge=edge, listener="app", version=version, before=before, after=after, reason=reason,
                        mode=mode, result=result, time=t, labels={"finding": f"f-{version}"})


def _count(es: Elasticsearch, stream: str, **term: str) -> int:
    es.indices.refresh(index=stream)
    q = {"term": term} if term else {"match_all": {}}
    return int(es.count(index=stream, query=q)["count"])


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_records_are_indexed_and_answer_the_why_question(es_url: str) -> None:
    stream = unique("opsloop-audit-why")
    edge = unique("ams")
    indexer = ElasticsearchIndexer(client_for(es_url), stream)
    audit = AuditLog([indexer])
    # 03:02 normal move, 03:12 the shed we ask about, 03:30 later (outside), another edge at 03:12.
    _push(audit, edge, T0 - 600, 41, {"eu": 1.0, "us": 0.0}, {"eu": 0.9, "us": 0.1}, "relax toward nearest origin")
    shed = _push(audit, edge, T0, 42, {"eu": 0.9, "us": 0.1}, {"eu": 0.6, "us": 0.4},
                 "origin eu over capacity (1.12), shed 30 %")
    _push(audit, edge, T0 + 1080, 43, {"eu": 0.6, "us": 0.4}, {"eu": 0.7, "us": 0.3}, "relax")
    _push(audit, unique("fra"), T0, 7, {"eu": 0.5, "us": 0.5}, {"eu": 0.4, "us": 0.6}, "other edge")
    _push(audit, edge, T0 + 10, 42, {"eu": 0.9, "us": 0.1}, {"eu": 0.6, "us": 0.4}, "shadow says the same",
          mode="shadow", result="unchanged")
    before_indexed = _metric("opsloop_audit_records_total", stream=stream, outcome="indexed")
    result = indexer.flush_all()
    assert result.ok and result.indexed == 5 and result.remaining == 0
    assert _metric("opsloop_audit_records_total", stream=stream, outcome="indexed") - before_indexed == 5

    es = Elasticsearch(es_url)
    es.indices.refresh(index=stream)
    answer = why_weights_changed(es, edge, parse_time("2026-11-22T03:12"), index=stream)
    assert [r.version for r in answer.records] == [41, 42, 42]          # oldest first, 03:02..03:12:59 only
    assert [r.id for r in answer.weight_changes] == [answer.records[0].id, shed.id]
    assert answer.records[1] == shed                                   # round trip through Elasticsearch
    text = render(answer)
    assert "eu: 0.9 -> 0.6" in text and "origin eu over capacity (1.12)" in text and "shadow" in text
    # A narrower window keeps only the 03:12 minute.
    narrow = why_weights_changed(es, edge, parse_time("2026-11-22T03:12"), window=timedelta(minutes=1),
                                 index=stream)
    assert [r.version for r in narrow.records] == [42, 42]
    # Keyword mappings: exact term queries on the record's fields.
    assert _count(es, stream, mode="shadow") == 1
    assert _count(es, stream, changed="us") == 5
    assert _count(es, stream, **{"labels.finding": "f-42"}) == 2

    # The same answer from the CLI (`opsloop audit search`), exit 0 with records, 1 without.
    r = audit_cli("search", "--es", es_url, "--index", stream, "--edge", edge, "--at", "2026-11-22T04:12+01:00")
    assert r.returncode == 0, r.stderr
    assert "origin eu over capacity (1.12)" in r.stdout and "v42" in r.stdout
    r = audit_cli("search", "--es", es_url, "--index", stream, "--edge", edge, "--at", "2026-11-22T05:00")
    assert r.returncode == 1 and "no audit record" in r.stdout


def test_resending_a_record_is_idempotent(es_url: str) -> None:
    stream = unique("opsloop-audit-dup")
    indexer = ElasticsearchIndexer(client_for(es_url), stream)
    audit = AuditLog([indexer])
    rec = _push(audit, "ams", T0, 1, {"eu": 1.0}, {"eu": 1.0}, "no-op")
    assert indexer.flush_all().indexed == 1
    audit.write(rec)                      # e.g. re-sent after a timeout whose request did reach Elasticsearch
    again = indexer.flush_all()
    assert again.duplicates == 1 and again.indexed == 0
    assert _count(Elasticsearch(es_url), stream) == 1


def test_a_document_elasticsearch_refuses_is_counted_and_dropped_not_retried(es_url: str) -> None:
    """A mapping error is a bug, not an outage: retrying cannot help, so it must not block the others."""
    stream = unique("opsloop-audit-reject")

    class Corrupting(ElasticsearchIndexer):
        def _actions(self, batch):
            for action in super()._actions(batch):
                if action["_source"]["version"] == 2:
                    action["_source"]["unmapped_field"] = "x"     # the template's mapping is strict
                yield action

    indexer = Corrupting(client_for(es_url), stream)
    audit = AuditLog([indexer])
    for v in (1, 2, 3):
        _push(audit, "ams", T0 + v, v, {"eu": 1.0}, {"eu": 0.5, "us": 0.5}, f"v{v}")
    result = indexer.flush_all()
    assert (result.indexed, result.rejected, result.remaining, result.ok) == (2, 1, 0, True)
    assert _metric("opsloop_audit_records_total", stream=stream, outcome="rejected") == 1
    assert _count(Elasticsearch(es_url), stream) == 2


KEPT = "opsloop-test-kept-streams"


def _without_audit_template(es: Elasticsearch) -> None:
    """Delete the audit template. Elasticsearch refuses while a data stream uses it and this distribution
    has no API to delete a data stream: the other tests' streams are handed to a template of their own."""
    streams = [d["name"] for d in es.indices.resolve_index(name="opsloop-audit*")["data_streams"]]
    if streams:
        es.indices.put_index_template(name=KEPT, index_patterns=streams, data_stream={}, priority=100)
    if es.indices.exists_index_template(name=AUDIT_TEMPLATE):
        es.indices.delete_index_template(name=AUDIT_TEMPLATE)


def test_a_cluster_restarted_empty_between_two_requests_gets_the_template_before_the_stream(es_url: str) -> None:
    """Before: the template went in before the first bulk request and again only after a failed one. A
    cluster restarted empty between two requests (none failed) had the next bulk auto-create the stream as
    a plain index with dynamic mapping (``version`` a long, ``mode`` text), for good. Now the next bulk
    request, later than a restart takes, checks the template first and installs it again.

    A data stream cannot be deleted here (no API in this distribution), so the records before the "restart"
    go to a plain index made with the template's mapping: the indexer does not tell them apart."""
    stream = unique("opsloop-audit-wiped")
    es = Elasticsearch(es_url)
    body = load_template(AUDIT_TEMPLATE)["template"]
    clock = [1000.0]
    indexer = ElasticsearchIndexer(client_for(es_url), stream, clock=lambda: clock[0])
    audit = AuditLog([indexer])
    try:
        _without_audit_template(es)
        es.indices.create(index=stream, mappings=body["mappings"], settings=body["settings"])
        _push(audit, "ams", T0, 1, {"eu": 1.0}, {"eu": 0.5, "us": 0.5}, "before the restart", mode="shadow")
        assert indexer.flush_all().indexed == 1
        assert es.indices.exists_index_template(name=AUDIT_TEMPLATE)     # installed by the indexer
        # the restart: the stream and the template gone, between two requests (none of the indexer's failed)
        es.indices.delete(index=stream)
        _without_audit_template(es)
        clock[0] += TEMPLATE_CHECK_S       # the next request comes later than a node takes to restart
        _push(audit, "ams", T0 + 1, 2, {"eu": 0.5, "us": 0.5}, {"eu": 1.0}, "after the restart", mode="shadow")
        result = indexer.flush_all()
        assert result.ok and result.indexed == 1, result
        assert [d["name"] for d in es.indices.resolve_index(name=stream)["data_streams"]] == [stream]
        (index_mapping,) = es.indices.get_mapping(index=stream).body.values()
        mapping = index_mapping["mappings"]
        assert mapping["dynamic"] == "strict", mapping
        assert {f: mapping["properties"][f]["type"] for f in ("version", "mode", "edge", "@timestamp")} \
            == {"version": "keyword", "mode": "keyword", "edge": "keyword", "@timestamp": "date"}, mapping
        assert _count(es, stream, mode="shadow") == 1 and _count(es, stream, version="2") == 1
    finally:
        install_template(es, AUDIT_TEMPLATE)          # as the other tests expect it (an indexer puts it back too)
        if es.indices.exists_index_template(name=KEPT):
            es.indices.delete_index_template(name=KEPT)
        if stream in [i["name"] for i in es.indices.resolve_index(name=stream)["indices"]]:
            es.indices.delete(index=stream)           # a plain index left by a failure (a data stream cannot go)


def test_outage_buffers_then_flushes_when_elasticsearch_is_back(es_url: str, proxy: Proxy) -> None:
    stream = unique("opsloop-audit-outage")
    indexer = ElasticsearchIndexer(client_for(proxy.url, request_timeout_s=3), stream, max_buffered=1000,
                                   initial_backoff_s=0.05, max_backoff_s=0.5, flush_interval_s=0.1).start()
    audit = AuditLog([indexer])
    try:
        _push(audit, "ams", T0, 1, {"eu": 1.0}, {"eu": 0.9, "us": 0.1}, "before the outage")
        wait_until(lambda: _metric("opsloop_audit_records_total", stream=stream, outcome="indexed") == 1,
                   timeout=30, what="first record indexed")
        proxy.stop()                                            # Elasticsearch unreachable
        failures_before = _metric("opsloop_audit_bulk_failures_total", stream=stream)
        records = [_push(audit, "ams", T0 + i, 1 + i, {"eu": 0.9}, {"eu": 0.8}, f"during the outage {i}")
                   for i in range(1, 21)]
        wait_until(lambda: _metric("opsloop_audit_bulk_failures_total", stream=stream) >= failures_before + 2,
                   timeout=30, what="bulk attempts failing while Elasticsearch is down")
        assert indexer.buffered == 20                           # nothing lost, nothing dropped
        assert sorted(indexer.pending_ids()) == sorted(r.id for r in records)
        assert _metric("opsloop_audit_dropped_total", stream=stream) == 0
        assert _count(Elasticsearch(es_url), stream) == 1
        proxy.start()                                           # back: the thread's next retry flushes all
        wait_until(lambda: indexer.buffered == 0
                   and _metric("opsloop_audit_records_total", stream=stream, outcome="indexed") == 21,
                   timeout=60, what="buffer flushed after the outage")
        es = Elasticsearch(es_url)
        assert _count(es, stream) == 21
        es.indices.refresh(index=stream)
        found = es.search(index=stream, size=100, query={"match_phrase": {"reason": "during the outage"}})["hits"]["hits"]
        assert sorted(h["_source"]["id"] for h in found) == sorted(r.id for r in records)
    finally:
        indexer.close(timeout_s=5)


def test_buffer_bound_drops_oldest_and_counts_them(es_url: str, proxy: Proxy) -> None:
    stream = unique("opsloop-audit-bound")
    bound = 5
    indexer = ElasticsearchIndexer(client_for(proxy.url, request_timeout_s=3), stream, max_buffered=bound,
                                   batch_size=3)
    audit = AuditLog([indexer])
    proxy.stop()
    records = [_push(audit, "ams", T0 + i, i, {"eu": 1.0}, {"eu": 0.5, "us": 0.5}, f"r{i}") for i in range(12)]
    assert indexer.buffered == bound
    assert _metric("opsloop_audit_dropped_total", stream=stream) == 12 - bound
    failed = indexer.flush()                                    # a failing attempt keeps the bound
    assert not failed.ok and "ConnectionError" in (failed.error or "")
    assert indexer.buffered == bound
    more = [_push(audit, "ams", T0 + 100 + i, 100 + i, {"eu": 1.0}, {"eu": 0.5, "us": 0.5}, f"m{i}") for i in range(2)]
    assert indexer.buffered == bound
    assert _metric("opsloop_audit_dropped_total", stream=stream) == 12 - bound + 2
    proxy.start()
    result = indexer.flush_all()
    assert result.ok and result.indexed == bound and result.remaining == 0
    es = Elasticsearch(es_url)
    es.indices.refresh(index=stream)
    ids = {h["_source"]["id"] for h in es.search(index=stream, size=100, query={"match_all": {}})["hits"]["hits"]}
    newest = [r.id for r in (records + more)[-bound:]]
    assert ids == set(newest)                                   # the oldest went first


def test_records_reach_the_kafka_audit_topic(kafka_bootstrap: str) -> None:
    publisher = KafkaAuditPublisher(kafka_bootstrap)
    audit = AuditLog([publisher])
    edge = unique("ams")
    rec = _push(audit, edge, T0, 9, {"eu": 1.0}, {"eu": 0.8, "us": 0.2}, "to kafka")
    publisher.flush()
    try:
        def mine():
            return [r for r in read_topic(kafka_bootstrap, Topic.AUDIT.value) if r.key == edge.encode()]

        got = wait_until(mine, timeout=30, what="audit record on the audit topic")
        assert len(got) == 1
        assert orjson.loads(got[0].value)["id"] == rec.id
        from opsloop.records import AuditRecord

        assert AuditRecord.decode(got[0].value) == rec
    finally:
        publisher.close()


def test_cli_reports_an_unreachable_elasticsearch() -> None:
    r = audit_cli("search", "--es", f"http://127.0.0.1:{free_port()}", "--edge", "ams", "--at",
                "2026-11-22T03:12")
    assert r.returncode == 2
    assert "Elasticsearch at http://127.0.0.1:" in r.stderr and "Traceback" not in r.stderr
