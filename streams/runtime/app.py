"""The Faust application: typed settings in one place, raw bytes on the wire, batch agents.

Values travel as raw bytes and are decoded by :mod:`opsloop.streams.runtime.batch` (orjson + pydantic), not
by Faust's codecs: one decode per record, and bad records reach the dead-letter topic instead of
failing inside Faust's deserializer.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Iterable, Sequence

import faust
import faust.types
from faust.types import TP
from mode.utils.compat import want_bytes

from opsloop.config import Settings
from opsloop.kafka_clients import faust_app_options
from opsloop.log import get_logger
from opsloop.records.deadletter import deadletter_key
from opsloop.topics import Topic
from opsloop.streams.runtime import health
from opsloop.streams.runtime.assignment import install_assignment_metrics
from opsloop.streams.runtime.batch import DeadLetter, FanOut, Handler, Highwater, SendDeadLetter, process_batch
from opsloop.streams.runtime.membership import install_membership_guard
from opsloop.streams.runtime.progress import install_partition_progress
from opsloop.streams.runtime.take import consumer_lag, take_batches
from opsloop.streams.runtime.transport import kafka_transport
from opsloop.streams.runtime.watchdog import install_recovery_watchdog

log = get_logger("stream")

# one metadata request per 30 s per worker (tests/streams/test_topic_recreated.py)
CONSUMER_METADATA_MAX_AGE_MS = 30_000
# At stop, Faust flushes its producer and aiokafka's flush waits for a broker: with the broker down the worker hung
# until its supervisor's SIGKILL (20 s under `opsloop run`), unsaid. Bounded below that, it says so and exits.
STOP_FLUSH_S = 10.0


def create_app(settings: Settings, app_id: str | None = None) -> faust.App:
    s = settings.stream
    s.data_dir.mkdir(parents=True, exist_ok=True)  # Faust needs the data dir's parent to exist
    app = faust.App(
        # id (kafka.topic_prefix applied: consumer group and changelog topics), brokers, TLS/SASL credentials
        **faust_app_options(settings.kafka, app_id or s.app_id),
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
        # Partitions added to a source topic, or a deleted one created again, are consumed only once the
        # consumer's metadata shows them: Faust's default refresh (5 min) left them unread that long, unsaid.
        consumer_metadata_max_age_ms=CONSUMER_METADATA_MAX_AGE_MS,
    )
    app.transport = kafka_transport(app, s.fetch_max_wait_ms)
    app.opsloop_topic_prefix = settings.kafka.topic_prefix   # read by raw_topic
    install_recovery_watchdog(app, s.recovery_stall_s)
    # a batch taken across a pause of a heartbeat interval or more: handled only if still a member
    install_membership_guard(app, app.conf.broker_heartbeat_interval, s.session_timeout_s)
    install_assignment_metrics(app)
    # every held source partition's committed offset, batch or not: a partition nobody processes is alerted
    install_partition_progress(app, s.progress_interval_s)
    install_bounded_stop_flush(app, STOP_FLUSH_S)
    return app


def install_bounded_stop_flush(app: faust.App, timeout_s: float) -> None:
    """Bound the producer flush of the worker's stop to ``timeout_s``. Nothing is lost that a SIGKILL would not
    lose: a batch's input offsets are committed only once its state writes are acknowledged, so what is still
    unsent was never committed past and is read again. A revocation's flush is left unbounded: the partitions'
    next owner must find those writes."""
    flush = app._producer_flush

    async def producer_flush(logger: Any) -> None:
        if not app.should_stop:
            await flush(logger)
            return
        try:
            await asyncio.wait_for(flush(logger), timeout_s)
        except asyncio.TimeoutError:
            log.warning("stop_flush_timeout", timeout_s=timeout_s,
                        reason="the producer's writes were not all acknowledged (no broker answered): the worker "
                               "stops without them; their batches were not committed and are read again")

    app._producer_flush = producer_flush  # type: ignore[method-assign]


class RawSchema(faust.Schema):
    """Keys and values as the bytes Kafka holds, the event built straight from the message.

    Faust's ``raw`` codec is the identity on bytes, but its generic decode looks the codec up and
    runs the model-reconstruction check on key and value for every record (~3 % of the worker's
    main thread in py-spy). This decode gives the event the same key and value (bytes, or None for a missing
    key or a tombstone, which :func:`~opsloop.streams.runtime.batch.decode_messages` dead-letters)."""

    def __init__(self) -> None:
        super().__init__(key_serializer="raw", value_serializer="raw")

    def compile(self, app: faust.types.AppT, *, default_propagate: bool = False,
                **on_decode_error: Any) -> Callable[..., Awaitable[faust.types.EventT]]:
        event = app.conf.Event   # Faust's create_event reads the setting per record

        async def decode(message: faust.types.Message, *, propagate: bool = default_propagate) -> faust.types.EventT:
            return event(app, _bytes(message.key), _bytes(message.value), message.headers, message)

        return decode


def _bytes(data: Any) -> bytes | None:
    return data if data is None or type(data) is bytes else want_bytes(data)   # as the raw codec


def raw_topic(app: faust.App, *topics: Topic | str) -> faust.TopicT:
    # internal=True: Faust creates missing topics at subscription (app's partition count) instead of
    # the consumer waiting minutes for a metadata refresh after a collector first creates them.
    prefix = getattr(app, "opsloop_topic_prefix", "")   # kafka.topic_prefix: every topic of this deployment
    return app.topic(*(f"{prefix}{t}" for t in topics), schema=RawSchema(), internal=True)


AfterBatch = Callable[[], Awaitable[None]]


def deadletter_sender(app: faust.App) -> SendDeadLetter:
    """What an agent gives :func:`process_batch` to dead-letter with: the send returns the delivery's future,
    which process_batch watches (a dead letter the broker refuses later is counted)."""
    deadletter = raw_topic(app, Topic.DEADLETTER)

    async def send_deadletter(dl: DeadLetter) -> Any:
        return await deadletter.send(key=deadletter_key(dl.key), value=dl.encode())
    return send_deadletter


def partition_highwater(app: faust.App) -> Highwater:
    """A partition's highwater as the app's consumer knows it; None before it is assigned or first fetched."""
    def highwater(topic: str, partition: int) -> int | None:
        try:
            return app.consumer.highwater(TP(topic, partition))
        except Exception:  # noqa: BLE001 - not assigned yet / no fetch yet
            return None
    return highwater


def batch_agent(app: faust.App, name: str, topics: Iterable[Topic], handlers: Sequence[Handler], settings: Settings,
                after_batch: Sequence[AfterBatch] = ()) -> None:
    """Register one agent that feeds every handler batches of valid samples from ``topics``.

    One agent per source, several handlers in order (:class:`FanOut`): each record is fetched,
    decoded and, if bad, dead-lettered and counted once. ``after_batch`` hooks run after the
    handlers (e.g. sending what a handler left in its outbox); a failing hook is logged and counted.
    """
    source = raw_topic(app, *topics)
    health.deadletter_series(source.topics)
    send_deadletter, highwater = deadletter_sender(app), partition_highwater(app)
    size, within = settings.stream.batch_size, settings.stream.batch_within_s
    handler: Handler = handlers[0] if len(handlers) == 1 else FanOut(name, handlers)

    async def agent(stream: faust.StreamT) -> None:
        async for events in take_batches(stream, size, within, settings.stream.batch_backlog_within_s,
                                         consumer_lag(app)):
            await process_batch(name, [e.message for e in events], handler, send_deadletter, highwater,
                                max_clock_skew_s=settings.stream.max_clock_skew_s)
            for hook in after_batch:
                try:
                    await hook()
                except Exception as e:  # noqa: BLE001 - a sink failure must not stop the agent
                    health.ERRORS.labels(name).inc()
                    log.error("after_batch_failed", agent=name, error=f"{type(e).__name__}: {e}", exc_info=True)

    app.agent(source, name=name)(agent)
