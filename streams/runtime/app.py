"""The Faust application: typed settings in one place, raw bytes on the wire, batch agents.

Values travel as raw bytes and are decoded by :mod:`streams.runtime.batch` (orjson + pydantic), not
by Faust's codecs: one decode per record, and bad records reach the dead-letter topic instead of
failing inside Faust's deserializer.
"""

from __future__ import annotations

from typing import Iterable

import faust
from faust.types import TP

from opsloop.config import Settings
from opsloop.wire import Topic
from streams.runtime.batch import DeadLetter, Handler, process_batch


def create_app(settings: Settings, app_id: str | None = None) -> faust.App:
    s = settings.stream
    brokers = ";".join(f"kafka://{b.strip()}" for b in settings.kafka.bootstrap_servers.split(","))
    s.data_dir.mkdir(parents=True, exist_ok=True)  # Faust needs the data dir's parent to exist
    return faust.App(
        app_id or s.app_id,
        broker=brokers,
        value_serializer="raw",
        key_serializer="raw",
        store="memory://",  # tables are rebuilt from their changelog topics on start
        datadir=str(s.data_dir),
        web_bind=s.metrics_bind,
        web_port=s.web_port,
        producer_linger=s.producer_linger_s,
        topic_partitions=settings.kafka.partitions,
        topic_replication_factor=settings.kafka.replication_factor,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        broker_session_timeout=s.session_timeout_s,
        broker_heartbeat_interval=min(3.0, s.session_timeout_s / 3),
    )


def raw_topic(app: faust.App, *topics: Topic | str) -> faust.TopicT:
    # internal=True: Faust creates missing topics at subscription (app's partition count) instead of
    # the consumer waiting minutes for a metadata refresh after a collector first creates them.
    return app.topic(*(str(t) for t in topics), value_serializer="raw", key_serializer="raw", internal=True)


def batch_agent(app: faust.App, name: str, topics: Iterable[Topic], handler: Handler, settings: Settings) -> None:
    """Register an agent that feeds ``handler`` batches of valid samples from ``topics``."""
    source = raw_topic(app, *topics)
    deadletter = raw_topic(app, Topic.DEADLETTER)
    size, within = settings.stream.batch_size, settings.stream.batch_within_s

    async def send_deadletter(dl: DeadLetter) -> None:
        await deadletter.send(key=dl.key, value=dl.encode())

    def highwater(topic: str, partition: int) -> int | None:
        try:
            return app.consumer.highwater(TP(topic, partition))
        except Exception:  # noqa: BLE001 - not assigned yet / no fetch yet
            return None

    async def agent(stream: faust.StreamT) -> None:
        async for events in stream.take_events(size, within=within):
            await process_batch(name, [e.message for e in events], handler, send_deadletter, highwater)

    app.agent(source, name=name)(agent)
