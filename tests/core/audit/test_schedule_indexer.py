"""Seeded fault schedules against the audit trail's :class:`ElasticsearchIndexer`.

The real indexer and the real ``elasticsearch`` client (``helpers.streaming_bulk``, the transport, its
exceptions) talk to an in-process Elasticsearch: a fake *node* (``node_class``) that answers ``PUT
_index_template`` and ``POST _bulk`` as Elasticsearch 8 does. ``create`` stores a document once per
``_id`` (201), a second time answers 409 version_conflict_engine_exception; per-item faults answer 429
es_rejected_execution_exception or 503 unavailable_shards_exception; a document its mapping refuses
answers 400 (document_parsing_exception / mapper_parsing_exception); with ``errors: true`` at the top.
Whole-request faults: connection refused (down), a timeout before the request took effect or *after*
it did (the documents are stored, the answer is lost), 429/503 for the whole request, and an API key
that lost its privileges (401 for the request, or 403 security_exception per item).

Schedule events: records submitted alone or in bursts (a burst during a long outage overflows the
bound), the same record submitted again, flushes, outages, faults, ``close()`` with records pending and
a restart (a new indexer and client) re-submitting the tail of the actuator's log.

A model of the buffer (submission order, the oldest dropped beyond ``max_buffered``, a record leaves
only on an answer: 201 indexed, 409 duplicate, 400 rejected) is checked after every step against
``pending_ids()``, the flush results, the metrics and the log. At the end (Elasticsearch healthy, all
flushed): every submitted record is stored exactly once, or was rejected with its reason logged, or
was dropped by the bound, or was reported unsent by ``close()``.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import threading
from collections import Counter as Multiset
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from elastic_transport import ApiResponseMeta, BaseNode, ConnectionError, ConnectionTimeout, HttpHeaders
from elastic_transport._node._base import NodeApiResponse   # the return type of BaseNode.perform_request
from elasticsearch import Elasticsearch

from opsloop.audit import indexer as indexer_module
from opsloop.audit.indexer import BUFFERED, BULK_FAILURES, DROPPED, RECORDS, ElasticsearchIndexer, FlushResult
from opsloop.audit.templates import AUDIT_TEMPLATE
from opsloop.records import AuditRecord
from tests.helpers import wait_until

T0 = 1_795_310_400.0
DONE = {201: "indexed", 409: "duplicate", 400: "rejected"}   # the answers that end a record's stay
BOUND, BATCH, RETRIES = 12, 5, 2
_streams = itertools.count()


# ---------------------------------------------------------------------------------------------- fake ES
@dataclass
class Call:
    """One request the fake answered (or applied and then timed out on: ``delivered`` False)."""

    kind: str                                    # "template", "template_check" or "bulk"
    items: list[tuple[str, int]] = field(default_factory=list)   # (_id, status) per document, in order
    delivered: bool = True


class FakeCluster:
    """One Elasticsearch node's behaviour; ``rng`` decides per-item faults (one draw per id and request)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.docs: dict[str, dict[str, Any]] = {}
        self.writes: Multiset[str] = Multiset()   # successful creates per _id: never above 1
        self.templates: set[str] = set()
        self.violations: list[str] = []
        self.calls: list[Call] = []
        self.up = True
        self.whole: int | None = None            # every request answered with this status as a whole
        self.item_fault_rate = 0.0               # per-id chance of a 429/503 answer in one request
        self.unauthorized_items = False          # the API key lost its index privileges: 403 per item
        self.timeout_before = False              # one shot: the next bulk times out without effect
        self.timeout_after = False               # one shot: the next bulk is applied, its answer lost
        self.max_docs: int | None = None         # a bulk of more documents is refused as too large (413)
        self.too_large: set[str] = set()         # ids of documents too large for any request (413)

    def restart_empty(self) -> None:
        """The node came back without its data: documents and index templates gone."""
        self.docs.clear()
        self.templates.clear()

    def healthy(self) -> None:
        self.up, self.whole, self.item_fault_rate = True, None, 0.0
        self.unauthorized_items = self.timeout_before = self.timeout_after = False

    def answer(self, method: str, target: str, body: bytes | None) -> tuple[int, dict[str, Any]]:
        if not self.up:
            raise ConnectionError("Connection refused (fake Elasticsearch is down)")
        path = target.split("?", 1)[0]
        if method == "PUT" and path.startswith("/_index_template/"):
            if self.whole in (401, 503):
                return self.whole, _whole_error(self.whole)
            self.templates.add(path.rsplit("/", 1)[1])
            self.calls.append(Call("template"))
            return 200, {"acknowledged": True}
        if method == "HEAD" and path.startswith("/_index_template/"):
            if self.whole in (401, 503):
                return self.whole, {}
            self.calls.append(Call("template_check"))
            return (200 if path.rsplit("/", 1)[1] in self.templates else 404), {}
        if method in ("POST", "PUT") and path in ("/_bulk", f"/{path.strip('/').split('/')[0]}/_bulk"):
            return self._bulk(body or b"")
        self.violations.append(f"unexpected request {method} {target}")
        return 400, _whole_error(400)

    def _bulk(self, body: bytes) -> tuple[int, dict[str, Any]]:
        lines = [orjson.loads(line) for line in body.splitlines() if line.strip()]
        if self.whole is not None:
            call = Call("bulk")
            for action in lines[::2]:
                call.items.append((str(next(iter(action.values()))["_id"]), self.whole))
            self.calls.append(call)
            return self.whole, _whole_error(self.whole)
        ids = [str(next(iter(action.values()))["_id"]) for action in lines[::2]]
        if (self.max_docs is not None and len(ids) > self.max_docs) or self.too_large & set(ids):
            self.calls.append(Call("bulk", [(rid, 413) for rid in ids]))
            return 413, _whole_error(413)
        if self.timeout_before:
            self.timeout_before = False
            raise ConnectionTimeout("Connection timed out (fake, before Elasticsearch took the request)")
        call, items = Call("bulk"), []
        faults: dict[str, int] = {}
        for action, source in zip(lines[::2], lines[1::2]):
            (op, meta), = action.items()
            rid, index = str(meta["_id"]), str(meta["_index"])
            backing = f".ds-{index}-2026.11.22-000001"
            if op != "create":
                self.violations.append(f"{op} for {rid}: only create keeps a re-sent record from being stored twice")
            if rid not in faults:
                roll = self.rng.random()
                faults[rid] = (self.rng.choice((429, 503)) if roll < self.item_fault_rate else
                               403 if self.unauthorized_items else 0)
            status = faults[rid]
            if status:
                item = {"_index": backing, "_id": rid, "status": status, "error": _item_error(status, rid, backing)}
            elif (source.get("labels") or {}).get("poison"):
                status = 400
                item = {"_index": backing, "_id": rid, "status": 400, "error": _item_error(400, rid, backing)}
            elif rid in self.docs:
                status = 409
                item = {"_index": backing, "_id": rid, "status": 409, "error": _item_error(409, rid, backing)}
            else:
                if not self.docs and AUDIT_TEMPLATE not in self.templates:
                    self.violations.append(f"data stream {index} created before the index template was installed")
                status = 201
                self.docs[rid] = source
                self.writes[rid] += 1
                item = {"_index": backing, "_id": rid, "_version": 1, "result": "created",
                        "_shards": {"total": 1, "successful": 1, "failed": 0}, "_seq_no": len(self.docs) - 1,
                        "_primary_term": 1, "status": 201}
            call.items.append((rid, status))
            items.append({op: item})
        self.calls.append(call)
        if self.timeout_after:
            self.timeout_after = False
            call.delivered = False
            raise ConnectionTimeout("Connection timed out (fake, after Elasticsearch applied the request)")
        return 200, {"took": 3, "errors": any(next(iter(i.values()))["status"] >= 300 for i in items), "items": items}


def _item_error(status: int, rid: str, index: str) -> dict[str, Any]:
    if status == 409:
        return {"type": "version_conflict_engine_exception", "index_uuid": "Xq1", "shard": "0", "index": index,
                "reason": f"[{rid}]: version conflict, document already exists (current version [1])"}
    if status == 429:
        return {"type": "es_rejected_execution_exception", "reason": "rejected execution of primary operation "
                "[coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, primary_operation_bytes=1, "
                "max_coordinating_and_primary_bytes=1]"}
    if status == 503:
        return {"type": "unavailable_shards_exception", "reason": f"[{index}][0] primary shard is not active "
                "Timeout: [1m], request: [BulkShardRequest [[{index}][0]] containing [1] requests]"}
    if status == 403:
        return {"type": "security_exception", "reason": "action [indices:data/write/bulk[s]] is unauthorized for "
                "API key id [k1] of user [opsloop-audit] on indices [opsloop-audit], this action is granted by "
                "the index privileges [create_doc,create,index,write,all]"}
    kind = random.Random(rid).choice(("document_parsing_exception", "mapper_parsing_exception"))
    return {"type": kind, "reason": f"[1:212] failed to parse field [labels.poison] in document with id '{rid}'",
            "caused_by": {"type": "illegal_argument_exception", "reason": "mapping set to strict"}}


def _whole_error(status: int) -> dict[str, Any]:
    kind, reason = {
        401: ("security_exception", "unable to authenticate with provided credentials and anonymous access is "
                                    "not allowed for this request"),
        429: ("es_rejected_execution_exception", "rejected execution of coordinating operation"),
        503: ("cluster_block_exception", "blocked by: [SERVICE_UNAVAILABLE/2/no master];"),
        413: ("request_too_large", "the request body exceeds the limit on content length"),
    }.get(status, ("illegal_argument_exception", "unexpected request"))
    err = {"type": kind, "reason": reason}
    return {"error": {"root_cause": [err], **err}, "status": status}


class FakeNode(BaseNode):
    """An ``elastic_transport`` node answering from a :class:`FakeCluster` (bound by :func:`fake_client`)."""

    cluster: FakeCluster

    def perform_request(self, method: str, target: str, body: bytes | None = None,
                        headers: HttpHeaders | None = None, request_timeout: Any = None) -> NodeApiResponse:
        status, doc = self.cluster.answer(method, target, body)
        headers_out = HttpHeaders({"content-type": "application/vnd.elasticsearch+json;compatible-with=8",
                                   "x-elastic-product": "Elasticsearch"})
        if status == 401:
            headers_out["www-authenticate"] = 'ApiKey realm="security"'
        meta = ApiResponseMeta(status=status, http_version="1.1", headers=headers_out, duration=0.0, node=self.config)
        return NodeApiResponse(meta, orjson.dumps(doc))


def fake_client(cluster: FakeCluster) -> Elasticsearch:
    """What ``client_for`` builds (no client-side retries), its requests going to ``cluster``."""
    node = type("BoundFakeNode", (FakeNode,), {"cluster": cluster})
    return Elasticsearch("http://es.test:9200", node_class=node, max_retries=0, retry_on_timeout=False,
                         request_timeout=5)


# ---------------------------------------------------------------------------------------------- helpers
def metric(name: str, **labels: str) -> float:
    """One sample of the indexer's metrics (its own collector only: the whole registry is slow to collect)."""
    family = {"opsloop_audit_records_total": RECORDS, "opsloop_audit_dropped_total": DROPPED,
              "opsloop_audit_buffered_records": BUFFERED, "opsloop_audit_bulk_failures_total": BULK_FAILURES}[name]
    for m in family.collect():
        for s in m.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def record(n: int, poison: bool = False) -> AuditRecord:
    labels = {"finding": f"f-{n}", **({"poison": "a value the mapping refuses"} if poison else {})}
    return AuditRecord.build(actor="controller.edge", action="edge.weights.push", target="haproxy:ams1/app",
                             edge="ams1", listener="app", version=n, before={"eu": 1.0}, after={"eu": 0.5, "us": 0.5},
                             reason=f"step {n}", mode="live", result="applied", time=T0 + n, labels=labels)


def new_indexer(cluster: FakeCluster, stream: str) -> ElasticsearchIndexer:
    return ElasticsearchIndexer(fake_client(cluster), stream, max_buffered=BOUND, batch_size=BATCH,
                                bulk_retries=RETRIES, initial_backoff_s=0.0, max_backoff_s=0.0)


class Model:
    """What the indexer must hold and have counted, derived from the submissions and the fake's answers."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.queue: list[str] = []               # ids, oldest first: the expected pending_ids()
        self.dropped: list[str] = []
        self.unsent: list[str] = []              # reported left by close()
        self.counts: Multiset[str] = Multiset()  # indexed / duplicate / rejected / dropped / bulk_failures
        self.rejected_ids: list[str] = []
        self.base = {k: self._metric(k) for k in ("indexed", "duplicate", "rejected", "dropped", "bulk_failures")}

    def _metric(self, key: str) -> float:
        if key == "dropped":
            return metric("opsloop_audit_dropped_total", stream=self.stream)
        if key == "bulk_failures":
            return metric("opsloop_audit_bulk_failures_total", stream=self.stream)
        return metric("opsloop_audit_records_total", stream=self.stream, outcome=key)

    def submitted(self, rid: str) -> None:
        self.queue.append(rid)
        while len(self.queue) > BOUND:
            self.dropped.append(self.queue.pop(0))
            self.counts["dropped"] += 1

    def flushed(self, calls: list[Call], batches: int) -> Multiset[str]:
        """Apply the answers of one flush (``batches`` = 1) or flush_all; return what it must report
        (``failed``: 1 when records of the last batch were kept for another try)."""
        got: Multiset[str] = Multiset()
        sent: list[tuple[list[str], set[str]]] = []   # per batch sent: its ids, the ids answered for good
        for call in calls:
            if call.kind != "bulk":
                continue
            ids = [rid for rid, _ in call.items]
            if not sent or set(sent[-1][0]) <= sent[-1][1]:   # the previous batch is settled: a new one
                offset = sum(len(b) for b, _ in sent)
                batch = self.queue[offset:offset + BATCH]
                assert ids == batch, f"a bulk request carries {ids}, not the oldest records {batch}"
                sent.append((batch, set()))
            else:
                assert set(ids) <= set(sent[-1][0]), f"a retry carries {ids}, not from its batch {sent[-1][0]}"
            for rid, status in call.items if call.delivered else ():
                if status in DONE:
                    got[DONE[status]] += 1
                    sent[-1][1].add(rid)
                    if status == 400:
                        self.rejected_ids.append(rid)
        assert len(sent) <= batches
        self.counts.update(got)
        settled = [b for b, done in sent if set(b) <= done]
        rest = self.queue[sum(len(b) for b in settled):]
        if len(settled) < len(sent):
            batch, done = sent[-1]
            self.queue = [r for r in batch if r not in done] + rest[len(batch):]
            failed = True
        else:
            # a batch that never reached Elasticsearch (down, timed out before): flush() when it sent
            # nothing, flush_all() whenever records are left (it goes on while batches succeed)
            self.queue = rest
            failed = bool(rest) and (batches > 1 or not sent)
        if failed:
            self.counts["bulk_failures"] += 1
            got["failed"] = 1
        return got

    def check_metrics(self, ctx: str) -> None:
        for key in self.base:
            assert self._metric(key) - self.base[key] == self.counts[key], f"{ctx}: metric {key}"


def check(ix: ElasticsearchIndexer, es: FakeCluster, model: Model, ctx: str) -> None:
    assert ix.pending_ids() == model.queue, f"{ctx}: pending {ix.pending_ids()} != model {model.queue}"
    assert ix.buffered == len(model.queue) <= BOUND, ctx
    assert metric("opsloop_audit_buffered_records", stream=model.stream) == ix.buffered, ctx
    model.check_metrics(ctx)
    assert not es.violations, f"{ctx}: {es.violations}"
    assert max(es.writes.values(), default=0) <= 1, f"{ctx}: a record stored twice"


def check_result(res: FlushResult, want: Multiset[str], model: Model, ctx: str) -> None:
    got = (res.indexed, res.duplicates, res.rejected, res.remaining, res.ok)
    assert got == (want["indexed"], want["duplicate"], want["rejected"], len(model.queue), not want["failed"]), \
        f"{ctx}: flush result {res} != answers {dict(want)}, {len(model.queue)} left"


# ---------------------------------------------------------------------------------------------- schedule
def run_schedule(seed: int, caplog: pytest.LogCaptureFixture, steps: int = 100) -> list[str]:
    rng = random.Random(seed)
    es = FakeCluster(random.Random(seed * 7919 + 1))
    stream = f"opsloop-audit-sched-{seed}-{next(_streams)}"
    ix, model = new_indexer(es, stream), Model(stream)
    log_of_actuator: list[AuditRecord] = []     # what the actuator wrote, in order (its structured log)
    trace: list[str] = []
    n = 0
    for step in range(steps):
        roll = rng.random()
        ctx = f"seed {seed} step {step}: " + " | ".join(trace[-6:])
        if roll < 0.30:
            for _ in range(rng.choice((1, 1, 1, 2, 4, 9))):   # a burst outgrows the bound during an outage
                n += 1
                rec = record(n, poison=rng.random() < 0.06)
                log_of_actuator.append(rec)
                ix.submit(rec)
                model.submitted(rec.id)
            trace.append(f"submit ..{n}")
        elif roll < 0.38 and log_of_actuator:
            rec = rng.choice(log_of_actuator[-15:])           # the same record again (an actuator's retry)
            ix.submit(rec)
            model.submitted(rec.id)
            trace.append(f"resubmit v{rec.version}")
        elif roll < 0.67:
            one = roll < 0.62                                 # flush() one batch, else flush_all()
            since = len(es.calls)
            res = ix.flush() if one else ix.flush_all()
            want = model.flushed(es.calls[since:], 1 if one else 10_000)
            check_result(res, want, model, ctx)
            trace.append(f"{'flush' if one else 'flush_all'} -> {res}")
        elif roll < 0.74:
            es.up = not es.up
            trace.append(f"es {'up' if es.up else 'down'}")
        elif roll < 0.78:
            es.whole = rng.choice((None, None, 429, 503, 401))
            trace.append(f"whole-request answer {es.whole}")
        elif roll < 0.83:
            es.item_fault_rate = rng.choice((0.0, 0.0, 0.2, 0.5))
            trace.append(f"item fault rate {es.item_fault_rate}")
        elif roll < 0.86:
            es.unauthorized_items = not es.unauthorized_items
            trace.append(f"403 per item {es.unauthorized_items}")
        elif roll < 0.91:
            es.timeout_after = True
            trace.append("next bulk: timeout after effect")
        elif roll < 0.94:
            es.timeout_before = True
            trace.append("next bulk: timeout before effect")
        else:
            # close with records pending, then a restart re-submitting the tail of the actuator's log
            since = len(es.calls)
            seen = len(caplog.records)
            res = ix.close(timeout_s=1.0)
            want = model.flushed(es.calls[since:], 10_000)
            check_result(res, want, model, ctx)
            unsent = [r for r in caplog.records[seen:] if getattr(r, "event", "") == "audit_records_unsent"]
            assert bool(unsent) == bool(res.remaining), f"{ctx}: close() left {res.remaining}, logged {unsent}"
            if unsent:
                assert unsent[0].fields["remaining"] == res.remaining, ctx   # type: ignore[attr-defined]
            check(ix, es, model, ctx + " (closed)")
            model.unsent += model.queue
            ix, model = new_indexer(es, stream), _carry(model)
            for rec in log_of_actuator[-rng.randint(0, 20):]:
                ix.submit(rec)
                model.submitted(rec.id)
            trace.append(f"close -> {res}; restart")
        check(ix, es, model, ctx)
    # Elasticsearch healthy again: everything left goes through.
    es.healthy()
    for i in range(BOUND + 2):
        since = len(es.calls)
        res = ix.flush()
        want = model.flushed(es.calls[since:], 1)
        check_result(res, want, model, f"seed {seed} drain {i}")
        if not model.queue:
            break
    check(ix, es, model, f"seed {seed} end")
    assert ix.buffered == 0, f"seed {seed}: still buffered after the drain"
    logged = {r.fields["id"]: r.fields for r in caplog.records          # type: ignore[attr-defined]
              if r.getMessage() == "audit_record_rejected"}
    for rec in log_of_actuator:
        rid, poison = rec.id, bool(rec.labels.get("poison"))
        if rid in es.docs:
            assert not poison, f"seed {seed}: v{rec.version} stored although its mapping refuses it"
        elif rid in model.rejected_ids:
            assert poison, f"seed {seed}: v{rec.version} rejected although Elasticsearch would take it"
            assert "parsing_exception" in str(logged.get(rid, {}).get("reason")), \
                f"seed {seed}: v{rec.version} rejected without its reason logged"
        else:
            assert rid in model.dropped or rid in model.unsent, \
                f"seed {seed}: v{rec.version} lost (not stored, rejected, dropped nor reported unsent)\n" + \
                "\n".join(trace)
    return trace


def _carry(old: Model) -> Model:
    """The model of a restarted indexer on the same stream (metrics are per stream: new baselines)."""
    new = Model(old.stream)
    new.dropped, new.unsent, new.rejected_ids = old.dropped, old.unsent, old.rejected_ids
    return new


# deterministic by default; OPSLOOP_SCHEDULE_SEED=N explores another block of seeds (the failure names it)
SEED_BASE = int(os.environ.get("OPSLOOP_SCHEDULE_SEED", "0"))


@pytest.mark.parametrize("seed", range(SEED_BASE, SEED_BASE + 30))
def test_schedule(seed: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="elastic_transport")   # a dead-node line per failed request
    with caplog.at_level(logging.WARNING, logger="opsloop.audit.indexer"):
        run_schedule(seed, caplog)


# ---------------------------------------------------------------------------------------------- regressions
def test_records_refused_for_the_api_key_are_kept_not_rejected() -> None:
    """403 security_exception per item (the key lost its index privileges): no record of it is at fault."""
    es = FakeCluster(random.Random(1))
    stream = f"opsloop-audit-forbidden-{next(_streams)}"
    ix = new_indexer(es, stream)
    recs = [record(i) for i in range(3)]
    for r in recs:
        ix.submit(r)
    es.unauthorized_items = True
    res = ix.flush()
    assert (res.indexed, res.rejected, res.remaining, res.ok) == (0, 0, 3, False)
    assert "403" in (res.error or "") and "security_exception" in (res.error or "")
    assert ix.pending_ids() == [r.id for r in recs]
    assert metric("opsloop_audit_records_total", stream=stream, outcome="rejected") == 0
    es.unauthorized_items = False                     # privileges back: the same records go through
    res = ix.flush_all()
    assert (res.indexed, res.remaining, res.ok) == (3, 0, True)
    assert set(es.docs) == {r.id for r in recs}


def test_a_whole_request_refused_keeps_the_batch() -> None:
    """401 for the whole bulk request (the API key expired after the template went in): an outage."""
    es = FakeCluster(random.Random(2))
    ix = new_indexer(es, f"opsloop-audit-expired-{next(_streams)}")
    ix.submit(record(0))
    assert ix.flush().indexed == 1                    # the template is installed, the key worked
    es.whole = 401
    recs = [record(i) for i in range(1, 4)]
    for r in recs:
        ix.submit(r)
    res = ix.flush()
    assert (res.indexed, res.rejected, res.remaining, res.ok) == (0, 0, 3, False)
    assert "AuthenticationException" in (res.error or "")
    assert ix.pending_ids() == [r.id for r in recs]
    es.whole = None
    assert ix.flush_all().indexed == 3
    assert len(es.docs) == 4


def test_a_request_refused_as_too_large_is_sent_again_in_smaller_ones() -> None:
    """413 for a batch (a proxy in front of the cluster takes at most 2 documents a request): the records are
    not at fault and the same batch would be refused for ever; smaller requests take them all."""
    es = FakeCluster(random.Random(3))
    stream = f"opsloop-audit-large-{next(_streams)}"
    ix = new_indexer(es, stream)
    recs = [record(i) for i in range(7)]
    for r in recs:
        ix.submit(r)
    es.max_docs = 2
    res = ix.flush_all()
    assert (res.indexed, res.rejected, res.remaining, res.ok) == (7, 0, 0, True)
    assert set(es.docs) == {r.id for r in recs}
    assert metric("opsloop_audit_records_total", stream=stream, outcome="rejected") == 0
    assert max(len(c.items) for c in es.calls if c.kind == "bulk" and all(st == 201 for _, st in c.items)) <= 2


def test_a_record_too_large_on_its_own_is_rejected_and_the_others_go_through() -> None:
    es = FakeCluster(random.Random(4))
    stream = f"opsloop-audit-huge-{next(_streams)}"
    ix = new_indexer(es, stream)
    recs = [record(i) for i in range(BATCH)]
    es.too_large = {recs[3].id}
    for r in recs:
        ix.submit(r)
    res = ix.flush_all()
    assert (res.indexed, res.rejected, res.remaining, res.ok) == (BATCH - 1, 1, 0, True)
    assert set(es.docs) == {r.id for r in recs} - {recs[3].id}
    assert metric("opsloop_audit_records_total", stream=stream, outcome="rejected") == 1
    ix.submit(record(100))                            # the limit grows back: later batches are whole again
    ix.submit(record(101))
    assert ix.flush_all().indexed == 2


class Ticks:
    """The indexer's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_cluster_restarted_empty_between_two_requests_gets_the_template_again_before_the_bulk() -> None:
    """Before: the template went in before the first bulk request and again only after a failed one; a
    cluster that restarted empty between two requests (no request failed) had the next bulk create the stream
    with dynamic mapping. Now a bulk more than ``TEMPLATE_CHECK_S`` after the last check checks it first
    (HEAD), at most once per interval however many requests, and installs it again if it is gone."""
    es = FakeCluster(random.Random(6))
    clock = Ticks()
    ix = ElasticsearchIndexer(fake_client(es), f"opsloop-audit-wiped-{next(_streams)}", batch_size=2,
                              initial_backoff_s=0.0, max_backoff_s=0.0, clock=clock)
    for i in range(6):
        ix.submit(record(i))
    assert ix.flush_all().indexed == 6
    kinds = [c.kind for c in es.calls]
    assert kinds == ["template", "bulk", "bulk", "bulk"], kinds    # installed once, no check per request
    clock.t += indexer_module.TEMPLATE_CHECK_S - 0.1
    ix.submit(record(6))
    assert ix.flush().indexed == 1 and es.calls[-1].kind == "bulk" and len(es.calls) == 5
    clock.t += 0.1                                    # the interval since the install is over: checked once
    for i in (7, 8, 9):
        ix.submit(record(i))
    assert ix.flush_all().indexed == 3
    assert [c.kind for c in es.calls[5:]] == ["template_check", "bulk", "bulk"]
    es.restart_empty()                                # between two requests: none of ours failed
    clock.t += indexer_module.TEMPLATE_CHECK_S
    ix.submit(record(10))
    assert ix.flush().indexed == 1
    assert [c.kind for c in es.calls[8:]] == ["template_check", "template", "bulk"]
    assert not es.violations and AUDIT_TEMPLATE in es.templates
    es.whole = 503                                    # a check that fails is an outage: the batch is kept
    clock.t += indexer_module.TEMPLATE_CHECK_S
    ix.submit(record(11))
    res = ix.flush()
    assert (res.indexed, res.remaining, res.ok) == (0, 1, False)
    es.whole = None
    es.restart_empty()
    assert ix.flush().indexed == 1 and [c.kind for c in es.calls[11:]] == ["template", "bulk"]
    assert not es.violations


def test_a_record_submitted_after_close_is_dropped_and_counted_not_buffered_for_ever() -> None:
    es = FakeCluster(random.Random(5))
    stream = f"opsloop-audit-closed-{next(_streams)}"
    ix = new_indexer(es, stream)
    ix.submit(record(0))
    assert ix.close().indexed == 1
    before = metric("opsloop_audit_dropped_total", stream=stream)
    ix.submit(record(1))
    assert ix.buffered == 0 and ix.pending_ids() == []
    assert metric("opsloop_audit_dropped_total", stream=stream) == before + 1


# ---------------------------------------------------------------------------------------------- thread mode
def _close_within(ix: ElasticsearchIndexer, guard_s: float = 30.0) -> FlushResult:
    """``close()`` on another thread; the join's timeout only detects a hang (no timing is asserted)."""
    out: list[FlushResult] = []
    closer = threading.Thread(target=lambda: out.append(ix.close(timeout_s=5.0)), daemon=True)
    closer.start()
    closer.join(guard_s)
    assert not closer.is_alive() and out, "close() hung"
    assert not [t for t in threading.enumerate() if t.name == f"audit-indexer:{ix.stream}" and t.is_alive()]
    return out[0]


def test_thread_mode_indexes_everything_through_faults() -> None:
    es = FakeCluster(random.Random(3))
    es.item_fault_rate = 0.3
    stream = f"opsloop-audit-thread-{next(_streams)}"
    ix = ElasticsearchIndexer(fake_client(es), stream, max_buffered=500, batch_size=7, bulk_retries=1,
                              initial_backoff_s=0.001, max_backoff_s=0.01, flush_interval_s=0.005).start()
    recs = [record(i, poison=i % 17 == 5) for i in range(60)]
    submissions = 0
    for i, r in enumerate(recs):
        ix.submit(r)
        submissions += 1
        if i % 10 == 3:
            ix.submit(recs[i - 2])                    # the same record again
            submissions += 1
        if i == 20:
            es.up = False
        elif i == 35:
            es.up, es.timeout_after = True, True
        elif i == 45:
            es.whole = 503
        elif i == 50:
            es.whole = None
    es.healthy()
    wait_until(lambda: ix.buffered == 0, timeout=30, interval=0.01, what="the thread indexing everything")
    res = _close_within(ix)
    assert (res.remaining, res.ok) == (0, True)
    poison = {r.id for r in recs if r.labels.get("poison")}
    assert set(es.docs) == {r.id for r in recs} - poison
    assert max(es.writes.values()) == 1
    outcomes = {o: metric("opsloop_audit_records_total", stream=stream, outcome=o)
                for o in ("indexed", "duplicate", "rejected")}
    assert outcomes["rejected"] == len(poison)
    assert sum(outcomes.values()) == submissions     # each submission answered exactly once, none dropped
    assert metric("opsloop_audit_dropped_total", stream=stream) == 0


def test_thread_mode_close_in_an_outage_reports_what_is_left_and_a_restart_sends_it() -> None:
    es = FakeCluster(random.Random(4))
    es.up = False
    stream = f"opsloop-audit-close-{next(_streams)}"
    # a back-off far longer than the hang guard: close() must interrupt it, not wait it out
    ix = ElasticsearchIndexer(fake_client(es), stream, max_buffered=50, batch_size=4, initial_backoff_s=3600.0,
                              max_backoff_s=3600.0, flush_interval_s=0.005).start()
    recs = [record(i) for i in range(6)]
    for r in recs:
        ix.submit(r)
    wait_until(lambda: metric("opsloop_audit_bulk_failures_total", stream=stream) >= 1, timeout=30,
               interval=0.01, what="a failed attempt (the thread now backs off)")
    res = _close_within(ix, guard_s=60.0)
    assert (res.remaining, res.ok) == (6, False) and "ConnectionError" in (res.error or "")
    assert ix.pending_ids() == [r.id for r in recs]
    es.up = True
    again = ElasticsearchIndexer(fake_client(es), stream, max_buffered=50, batch_size=4, initial_backoff_s=0.001,
                                 max_backoff_s=0.01, flush_interval_s=0.005).start()
    for r in recs:                                    # the actuator's log re-submitted after the restart
        again.submit(r)
    wait_until(lambda: again.buffered == 0, timeout=30, interval=0.01, what="the restarted indexer's flush")
    assert _close_within(again).remaining == 0
    assert set(es.docs) == {r.id for r in recs}


def test_an_answer_the_client_cannot_read_does_not_end_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything but a transport/API error out of the bulk helper (a KeyError on a 200 answer without
    ``items``) ended the thread: every later record stayed buffered, unsent, with nothing said."""
    es = FakeCluster(random.Random(4))
    real = indexer_module.helpers.streaming_bulk
    calls = itertools.count()

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if next(calls) == 0:
            raise KeyError("items")
        return real(*args, **kwargs)

    monkeypatch.setattr(indexer_module.helpers, "streaming_bulk", flaky)
    ix = ElasticsearchIndexer(fake_client(es), f"opsloop-audit-unreadable-{next(_streams)}", batch_size=5,
                              initial_backoff_s=0.001, max_backoff_s=0.01, flush_interval_s=0.005).start()
    recs = [record(i) for i in range(8)]
    for r in recs:
        ix.submit(r)
    wait_until(lambda: ix.buffered == 0, timeout=30, interval=0.01, what="the records after the unreadable answer")
    assert _close_within(ix).remaining == 0
    assert set(es.docs) == {r.id for r in recs}
