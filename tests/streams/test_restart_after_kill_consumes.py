"""A worker restarted after a SIGKILL handles the next record (real worker, real Kafka).

What was seen: the restarted worker logged ``Worker ready`` and then handled nothing, without a log line
(2 restarts in 14, with or without a damaged changelog tail). Every telemetry partition had no committed
offset (the killed worker had not committed yet), its position at the highwater: the records had been
fetched around the recovery's "seek to the committed offsets", dropped there as Faust drops them, and the
seek that should bring them back left a partition without a commit where it was (aiokafka seeks only
offsets above 0). ``streams/runtime/transport.py``.

Before (old code): ``test_seek_to_committed_rewinds_a_stream_partition_without_a_commit`` fails every time
(the position stays at the end); the restart test fails in about 1 run of 7.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from kafka import KafkaProducer

from opsloop.config import load_settings
from opsloop.streams.agents.stateful import STATE_TABLE
from opsloop.streams.runtime.transport import faust_leader_topic
from opsloop.streams.worker import build_app
from tests.helpers import captured_logs, unique
from tests.streams.agents.test_integration import produce
from tests.streams.test_refused_state_on_kafka import Run

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("damage", [None, b'"firewall-detector|to', b"\xff\xfe"], ids=["plain", "torn", "not-utf8"])
def test_a_restarted_worker_handles_the_next_record(stack: Any, tmp_path: Path, damage: bytes | None) -> None:
    """Killed once its states are in the changelog (often before its first commit), started again, maybe
    over a changelog whose tail is a damaged key: hv-b's next round is handled."""
    run = Run(stack, tmp_path, ("hv-a", "hv-b"))
    run.build_then_kill()
    if damage is not None:
        partition = run.changelog_records()[run.table_key("hv-b")].partition
        run.write([(damage, b"{}", partition)])
    with run.restarted():
        produce(run.bootstrap, [run.round("hv-b", 1)])
        run.handled("hv-b", 1)


def _seek_app(stack: Any, tmp_path: Path) -> Any:
    app_id = unique("t-seek")
    settings = load_settings(None, {"kafka": {"bootstrap_servers": stack.kafka_bootstrap},
                                    "stream": {"app_id": app_id, "data_dir": str(tmp_path / "streams")}})
    return build_app(settings)


def _positions_after_seek(stack: Any, app: Any, tps: list[TopicPartition],
                          commits: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Faust's ``perform_seek`` through the worker's real consumer against the broker, ``tps`` (3 records each)
    read to their end and ``commits`` committed first: the position of each partition after it."""
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
    try:
        for tp in tps:
            for i in range(3):
                producer.send(tp.topic, key=b"k", value=b"%d" % i, partition=0)
        producer.flush()
    finally:
        producer.close()

    async def main() -> dict[TopicPartition, int]:
        thread = app.consumer._thread
        consumer = thread._create_worker_consumer(app.transport)   # Faust's settings: group, offset reset

        async def here(fun: Any, *args: Any, **kwargs: Any) -> Any:   # the consumer thread's loop is this one
            return await fun(*args, **kwargs)

        thread._consumer, thread.call_thread = consumer, here
        await consumer.start()
        try:
            consumer.assign(tps)
            while [tp for tp in tps if await consumer.position(tp) < 3]:
                await consumer.getmany(*tps, timeout_ms=500)
            if commits:
                await consumer.commit(commits)
            await app.consumer.perform_seek()
            return {tp: await consumer.position(tp) for tp in tps}
        finally:
            await consumer.stop()

    with captured_logs():
        return asyncio.run(main())


def test_seek_to_committed_rewinds_a_stream_partition_without_a_commit(stack: Any, tmp_path: Path) -> None:
    """Three partitions read to their end (3 records each); a stream partition without a commit goes back to its
    first record, one committed at 2 to 2, the table's changelog partition (never committed, the recovery's)
    stays."""
    app = _seek_app(stack, tmp_path)
    uncommitted, committed = TopicPartition(unique("t-seek-a"), 0), TopicPartition(unique("t-seek-b"), 0)
    changelog = TopicPartition(f"{app.conf.id}-{STATE_TABLE}-changelog", 0)
    tps = [uncommitted, committed, changelog]
    positions = _positions_after_seek(stack, app, tps, {committed: 2})
    assert positions == {uncommitted: 0, committed: 2, changelog: 3}


def test_seek_to_committed_leaves_fausts_leader_topic_alone(stack: Any, tmp_path: Path) -> None:
    """Faust's leader-election topic (every worker is assigned it, nothing commits it) stays where it is: it was
    reset at every seek and named in every ``uncommitted_partitions_reset`` line. Matched by its exact name: a
    topic of ours with ``__`` in its name and no commit is rewound like any other."""
    app = _seek_app(stack, tmp_path)
    leader = TopicPartition(faust_leader_topic(app.conf.id), 0)
    assert leader.topic == app._leader_assignor._leader_topic_name   # Faust's own name for it (an upgrade may move it)
    ours = TopicPartition(f"{unique('t-seek')}-__assignor-__leader", 0)   # another app id: ours
    positions = _positions_after_seek(stack, app, [leader, ours], {})
    assert positions == {leader: 3, ours: 0}
