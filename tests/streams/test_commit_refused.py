"""A commit the group refuses (the worker's generation ended: frozen past the session timeout, a rebalance) is
not taken for a commit (real worker consumer, real broker).

What the code did (faust-streaming 0.15.3 ``Consumer._commit_offsets``): when aiokafka refused a commit with
"already rebalanced" (``ConsumerThread._commit`` returns False, silently), Faust still recorded the offsets in
``_committed_offset``. A revocation clears that record, but a commit in flight during the revocation (its
``wait_empty`` waits for it) writes it back afterwards, and the next assignment's seek overwrites it only for a
partition the broker has a commit of. So a partition never committed was "committed" in the worker's view:
``opsloop_stream_committed_offset`` showed the refused offset, and Faust's ``ack`` ignores every offset below
it, so the records read again from the log start were handled and never committed (replayed at every restart,
the broker's commit unmoved). Nothing said the commit was refused. Here the worker's consumer is frozen (its
event loop blocked) until the broker has dropped it, then commits what it acked before the freeze.

Old code: the refused offset stays Faust's committed one, the progress gauge exports it, no ``commit_refused``
line, and the records acked again after the rejoin are never committed on the broker.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from faust.types import TP, Message
from kafka import KafkaAdminClient, KafkaProducer
from prometheus_client import REGISTRY

from opsloop.config import load_settings
from opsloop.streams.runtime.app import create_app
from opsloop.streams.runtime.progress import PartitionProgress
from tests.helpers import captured_logs, unique, wait_until
from tests.streams.test_partition_progress import group_offsets

pytestmark = pytest.mark.integration

RECORDS = 3
REFUSED = "opsloop_stream_commits_refused_total"


def group_state(bootstrap: str, group: str) -> str:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return str(admin.describe_groups([group])[group].get("group_state"))
    finally:
        admin.close()


def refused_total() -> float:
    return REGISTRY.get_sample_value(REFUSED) or 0.0


def test_a_refused_commit_is_logged_counted_and_not_taken_for_committed(stack: Any, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    app_id, topic = unique("t-refused"), unique("t-refused-src")
    settings = load_settings(None, {"kafka": {"bootstrap_servers": bootstrap},
                                    "stream": {"app_id": app_id, "data_dir": str(tmp_path / "streams"),
                                               "session_timeout_s": 6.0}})
    app = create_app(settings)

    async def agent(stream: Any) -> None:   # never started: makes the topic a stream source (progress.py)
        async for _ in stream:
            pass
    app.agent(app.topic(topic), name="source")(agent)
    tp = TP(topic, 0)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i in range(RECORDS):
            producer.send(topic, key=b"k", value=b"%d" % i, partition=0)
        producer.flush()
    finally:
        producer.close()

    async def read_all(consumer: Any) -> list[Message]:
        """Joined (an assignment), then this partition read to its end: Faust's messages of it."""
        out: list[Message] = []
        while len(out) < RECORDS:
            for rs in (await consumer.getmany(timeout_ms=500)).values():
                out += [Message(r.topic, r.partition, r.offset, r.timestamp / 1000, r.timestamp_type, r.headers,
                                r.key, r.value, r.checksum, tp=tp) for r in rs]
        return out

    async def handle(messages: list[Message]) -> bool:
        for m in messages:
            app.consumer.ack(m)   # Faust's own bookkeeping of a handled record
        return await app.consumer.commit()

    async def main() -> tuple[bool, int | None, float | None, bool]:
        thread = app.consumer._thread
        consumer = thread._create_worker_consumer(app.transport)   # Faust's: group, session timeout, offset reset

        async def here(fun: Any, *args: Any, **kwargs: Any) -> Any:   # the consumer thread's loop is this one
            return await fun(*args, **kwargs)

        thread._consumer, thread.call_thread = consumer, here
        app.topics._acking_topics.add(topic)   # as the conductor does for an agent's source topic
        await consumer.start()
        try:
            consumer.subscribe([topic])
            messages = await read_all(consumer)
            # frozen (the loop blocked: no heartbeat) until the coordinator has dropped this member
            wait_until(lambda: group_state(bootstrap, app_id) == "Empty", timeout=60, interval=0.5,
                       what="the frozen member dropped from its group")
            did_commit = await handle(messages)
            faust_committed = app.consumer._committed_offset.get(tp)
            progress = PartitionProgress(app, timeout_s=5.0)
            await progress.tick()
            exported = REGISTRY.get_sample_value("opsloop_stream_committed_offset",
                                                 {"group": app_id, "topic": topic, "partition": "0"})
            # back in the group (a new generation), sought back to the commits: the records come again,
            # are handled and committed
            await app.consumer.perform_seek()
            again = await read_all(consumer)
            return did_commit, faust_committed, exported, await handle(again)
        finally:
            await consumer.stop()

    before = refused_total()
    with captured_logs() as logs:
        did_commit, faust_committed, exported, committed_again = asyncio.run(main())
    assert not did_commit   # the broker refused it: this member's generation is gone
    assert faust_committed is None, "the refused offset was taken for committed"
    assert exported == 0, "the progress gauge shows a commit the broker never took (log start: 0)"
    assert refused_total() - before == 1
    assert any(line.startswith("commit_refused ") and topic in line for line in logs.lines), logs.lines
    assert committed_again and group_offsets(bootstrap, app_id) == {(topic, 0): RECORDS}
