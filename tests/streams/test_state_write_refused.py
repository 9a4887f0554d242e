"""A state write the broker refuses, on the real path: a real worker, its ``detector-state`` changelog on the
test stack's broker, the changelog taking records of at most 1,500 bytes (``max.message.bytes``, as an operator
may set it; the worker's own size guard weighs against Faust's 1,000,000 bytes and lets the write go).

Before (old code): the broker refused the write after Faust's producer buffer had taken it; all that was left was
Faust's warning ``_on_published error ... MessageSizeTooLargeError``. Faust's commit waits for a write to end,
not to succeed: the batch's offsets were committed, and a restart restored the key's older copy (here none) without
replaying the records that built it: lost, in silence (seen: the host's window gone after the restart).
Now: the agent waits for its batch's state writes to be acknowledged before the batch is acked; a refused write is
written again (three attempts), then logged ``state_write_failed``, counted and dead-lettered naming the key
(``OpsloopDeadLetterGrowing``); the batch goes on (no partition held by a write that can never succeed), the key's
state stays in memory and is written by the next batch touching it once the changelog takes it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from opsloop.streams.agents.stateful import STATE_TABLE
from opsloop.topics import Topic
from tests.helpers import create_topics, read_topic, scrape_metric, unique, wait_until
from tests.streams.detectors.test_keystone_state_bounds_live import Run, _cred

pytestmark = pytest.mark.integration

CHANGELOG_LIMIT = 1500   # the changelog's max.message.bytes: a host of 40 access keys is over it, one of 1 is not


def _set_limit(bootstrap: str, topic: str, limit: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                            configs={"max.message.bytes": str(limit)})])
    finally:
        admin.close()


def _deadletters(run: Run, host: str) -> list[dict[str, Any]]:
    out = []
    for r in read_topic(run.bootstrap, run.prefix + Topic.DEADLETTER.value):
        doc = orjson.loads(r.value)
        if isinstance(doc.get("value"), dict) and doc["value"].get("state_key") == host:
            out.append(doc)
    return out


def test_a_state_write_the_broker_refuses_is_retried_dead_lettered_and_written_once_it_fits(
        stack: Any, tmp_path: Path) -> None:
    run = Run(stack, tmp_path)
    changelog = f"{run.group}-{STATE_TABLE}-changelog"
    create_topics(run.bootstrap, changelog, partitions=run.doc["kafka"]["partitions"],
                  max_message_bytes=CHANGELOG_LIMIT)
    big, small = unique("rgw-big"), unique("rgw-small")
    t0 = time.time() - 1800
    t0 -= t0 % 60
    worker = run.start()
    try:
        # one record, one batch: the big host's write refused, the small host's taken
        run.send([(big, [_cred(big, f"AK{i:03d}" + "k" * 60, t0) for i in range(40)] +
                   [_cred(small, "AKIASMALL", t0, 2)])])
        wait_until(lambda: run.window(big) == 120 and run.window(small) == 2, timeout=90, what="the batch handled")
        letters = wait_until(lambda: _deadletters(run, big), timeout=60, what="the refused write dead-lettered")
        assert len(letters) == 1, letters
        doc = letters[0]
        assert doc["source_topic"] == run.topic and doc["value"]["handler"] == "keystone-detector", doc
        assert "MessageSizeTooLarge" in doc["reason"] and f"keystone-detector|{big}" in doc["reason"], doc
        # the small host, refused with it (the broker refuses a producer batch whole), written on its own
        assert _deadletters(run, small) == []
        assert scrape_metric(run.port, "opsloop_stream_deadlettered_total", {"topic": run.topic}) == 1
        assert (scrape_metric(run.port, "opsloop_stream_errors_total", {"agent": "detectors"}) or 0) >= 3   # attempts
        failed = [orjson.loads(x)["fields"] for x in worker.logfile.read_text().splitlines()
                  if '"event":"state_write_failed"' in x]
        assert failed and failed[0]["state_key"] in (big, small), failed   # one line a minute per handler
        assert "MessageSizeTooLarge" in failed[0]["error"], failed
        # the batch went on: the small host's state written, the offsets committed, the next record handled
        assert wait_until(lambda: run.state(small)[0], timeout=30, what="the small host's state written")
        assert run.state(big) == (None, 0)
        wait_until(run.committed, timeout=60, what="the batch's offsets committed")
        assert worker.running(), worker.tail(40)

        # the changelog takes it again: the next batch touching the key writes its whole state, a restart restores it
        _set_limit(run.bootstrap, changelog, 1_000_000)
        run.send([(big, [_cred(big, "AKIALATER", t0 + 60, 3)])])
        wait_until(lambda: run.window(big) == 123, timeout=60, what="the next record of the big host handled")
        wait_until(lambda: (run.state(big)[0] or {}).get("last_ts"), timeout=60, what="its state written")
        worker = run.restart_and_restore(worker)
        assert run.window(big) == 123   # every validation, those of the refused batch too
        assert len(_deadletters(run, big)) == 1
    finally:
        worker.stop()
