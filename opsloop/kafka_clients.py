"""Every Kafka client opsloop makes takes its options from here: brokers, TLS/SASL, names on the cluster.

One place maps the ``kafka`` settings (``opsloop.config.KafkaSettings``) onto each client library, so
no call site repeats it:

* :func:`client_options` -- ``bootstrap_servers`` plus TLS/SASL keyword arguments for kafka-python's
  ``KafkaProducer``, ``KafkaConsumer`` and ``KafkaAdminClient`` (collectors, controllers, audit, admin);
* :func:`aiokafka_client_options` -- the same for aiokafka's clients;
* :func:`faust_app_options` -- broker URLs, ``broker_credentials`` and the app id for ``faust.App``;
* ``KafkaSettings.topic(name)`` / ``.group(id)`` -- names with ``kafka.topic_prefix`` applied;
* :func:`preflight_or_exit` -- run at every service's start: a wrong password or an untrusted CA ends
  the process (exit 78, ``exitcodes.CONFIG``: systemd does not restart it) with one log line naming the
  problem, instead of a client retrying forever;
* :func:`send_deadletter` -- a refused record onto the dead-letter topic (the controllers), and
  ``opsloop_deadletter_send_failures_total`` (:mod:`opsloop.deadletter_metrics`), the dead letters of any
  stage (the stream worker's too) never written.

What the client libraries log themselves (each retry of each loop while a broker is away) is counted and limited
to one line a minute per kind by the common logging setup (:class:`opsloop.log.ClientLogLimiter`).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from opsloop import exitcodes
from opsloop.config import KafkaSettings
from opsloop.deadletter_metrics import DEADLETTER_SEND_FAILURES
from opsloop.log import Sampled
from opsloop.records import deadletter_record
from opsloop.records.deadletter import ValueIs, deadletter_key, replayed_from_header
from opsloop.topics import Topic
from opsloop.kafka_security import (KafkaSecurityError, KafkaUnreachable, faust_credentials, kafka_python_options,
                                    preflight)

# Exit status of a service whose Kafka settings cannot work: a bad configuration, not restarted by systemd.
EXIT_KAFKA_SETTINGS = exitcodes.CONFIG


def kafka_settings(kafka: KafkaSettings | str) -> KafkaSettings:
    """Accept a plain bootstrap string (PLAINTEXT, no prefix: tests, tools) where settings are expected."""
    return kafka if isinstance(kafka, KafkaSettings) else KafkaSettings(bootstrap_servers=kafka)


def client_options(kafka: KafkaSettings | str) -> dict[str, Any]:
    """``bootstrap_servers`` and the TLS/SASL keyword arguments for any kafka-python client."""
    k = kafka_settings(kafka)
    return {"bootstrap_servers": k.bootstrap_servers, **kafka_python_options(k.security)}


def service_producer(kafka: KafkaSettings | str, client_id: str, **options: Any) -> KafkaProducer:
    """The kafka-python producer of a long-running service (controllers, the audit sink): ``acks=all``, not
    idempotent, one request in flight. kafka-python 3.0's idempotent producer (its default) takes any
    non-retriable error of a batch (a record over a topic's ``max.message.bytes``, a topic it may not write)
    as fatal and fails every later send to any topic until the process restarts: one dead letter too big for
    its topic stopped the edge controller's decisions. Without idempotence a retry may duplicate a record
    (consumers dedupe: versions, finding ids) and one request in flight keeps the order. The collectors'
    publisher uses it too (and does not spool a record refused for good)."""
    return KafkaProducer(**client_options(kafka), client_id=client_id, acks="all", enable_idempotence=False,
                         max_in_flight_requests_per_connection=1, **options)


def without_auto_create(client: Any) -> bool:
    """Have ``client``'s (a producer's or a consumer's) metadata requests not ask the broker to create a topic; False
    when this kafka-python does not let it. Its clients take ``allow_auto_create_topics=False`` but build their cluster
    metadata without it: a topic deleted meanwhile was re-created by the broker at the next send or fetch
    (``opsloop deadletter replay``: tests/core/test_deadletter_replay_topic_deleted.py)."""
    cluster = getattr(client, "_metadata", None)   # the producer's
    if cluster is None:
        cluster = getattr(client, "_cluster", None)   # the consumer's
    config = getattr(cluster, "config", None)
    if isinstance(config, dict) and "allow_auto_create_topics" in config:
        config["allow_auto_create_topics"] = False
        return True
    return False


def aiokafka_client_options(kafka: KafkaSettings | str) -> dict[str, Any]:
    """The same for aiokafka's AIOKafkaProducer/AIOKafkaConsumer/AIOKafkaAdminClient."""
    return client_options(kafka)


def faust_app_options(kafka: KafkaSettings, app_id: str) -> dict[str, Any]:
    """``id``, ``broker`` and ``broker_credentials`` for ``faust.App`` (the app id carries the prefix, so
    the changelog and repartition topics Faust derives from it do too)."""
    brokers = ";".join(f"kafka://{b.strip()}" for b in kafka.bootstrap_servers.split(",") if b.strip())
    return {"id": kafka.group(app_id), "broker": brokers, "broker_credentials": faust_credentials(kafka.security)}


def preflight_or_exit(kafka: KafkaSettings, service: str, log: Any, timeout_s: float = 10.0) -> None:
    """Check the Kafka settings against the brokers before a service starts its clients.

    PLAINTEXT has nothing to check (no password, no certificate): skipped. A rejected login, an
    untrusted certificate or an unreadable password/CA file: one ``kafka_preflight_failed`` error line
    and ``SystemExit(EXIT_KAFKA_SETTINGS)`` (78). No broker answering at all is not a settings error: a
    warning, and the service goes on (its clients retry; a collector spools).
    """
    if kafka.security.protocol == "PLAINTEXT":
        return
    try:
        preflight(kafka.bootstrap_servers, kafka.security, timeout_s=timeout_s)
    except KafkaUnreachable as e:
        log.warning("kafka_unreachable_at_start", service=service, error=str(e))
        return
    except KafkaSecurityError as e:
        log.error("kafka_preflight_failed", service=service, error=str(e))
        sys.exit(EXIT_KAFKA_SETTINGS)
    log.info("kafka_preflight_ok", service=service, protocol=kafka.security.protocol,
             mechanism=kafka.security.sasl_mechanism, user=kafka.security.username)


def connect_with_retry(connect: Callable[[], None], stop: threading.Event, service: str, log: Any,
                       initial_s: float = 0.5, max_s: float = 30.0) -> bool:
    """Call ``connect()`` (which builds Kafka clients) until it succeeds: True; False if ``stop`` is set first.

    kafka-python's clients ask a broker for its API versions when they are built, so a broker that is
    away at start raises ``NoBrokersAvailable`` there, before any of the service's own retry loops:
    a service started before its broker (a reboot, a rolling broker restart) must wait, not crash.
    Retries back off exponentially (``initial_s`` doubling to ``max_s``) with a warning each time.
    """
    delay = initial_s
    attempt = 0
    while not stop.is_set():
        attempt += 1
        try:
            connect()
            return True
        except (KafkaError, OSError) as e:
            log.warning("kafka_unavailable", service=service, attempt=attempt, retry_in_s=delay,
                        error=f"{type(e).__name__}: {e}"[:300])
        stop.wait(delay)
        delay = min(delay * 2, max_s)
    return False


# kafka-python's commit() waits for the coordinator up to request_timeout_ms (30 s) with the broker away, then
# raises: a service loop calling it each step (the weight actuator's ticks, paging's re-sends) waited that long.
COMMIT_TIMEOUT_S = 2.0
COMMIT_LOG = Sampled(60.0)   # commits the broker did not take (away): one line a minute


def commit_bounded(consumer: Any, log: Any, failures: Any, consequence: str) -> bool:
    """``consumer.commit()`` waiting at most :data:`COMMIT_TIMEOUT_S`; False when the broker did not take it (away,
    group rebalanced): counted in ``failures``, logged ``commit_failed`` once a minute, the caller still owes it
    and tries again next step (``consequence`` says what a restart meanwhile does)."""
    try:
        consumer.commit(timeout_ms=int(COMMIT_TIMEOUT_S * 1000))
    except KafkaError as e:
        failures.inc()
        COMMIT_LOG.warning(log, "commit_failed", error=f"{type(e).__name__}: {e}"[:300], timeout_s=COMMIT_TIMEOUT_S,
                           consequence=consequence)
        return False
    return True


DEADLETTER_LOST_LOG = Sampled(60.0)
# a dead-letter send that timed out (no metadata for the topic, or no buffer, within max_block_ms): the producer's
# next dead letters are not sent for this long (monotonic), each would block as long and be lost the same
DEADLETTER_UNAVAILABLE_RETRY_S = 60.0
_GATE_ATTR = "_opsloop_deadletter_gate"


@dataclass
class TopicGate:
    """Sends to a topic held back after one timed out: ``send`` blocks the producer's ``max_block_ms`` when the topic
    has no metadata (not created, on brokers that do not auto-create) or the buffer is full, and each later record
    would block as long and be lost the same. After :meth:`trip` the sends of the next ``retry_s`` (monotonic) are
    refused at once (:meth:`held`); then the topic is tried again. Dead letters (one per producer) and paging's audit
    records use one each."""
    clock: Callable[[], float] = field(default_factory=lambda: time.monotonic)
    retry_s: float = DEADLETTER_UNAVAILABLE_RETRY_S
    retry_at: float | None = None   # clock time the topic is tried again after a send timed out

    def held(self) -> float | None:
        """Seconds until the topic is tried again; None when a send may be tried."""
        if self.retry_at is None:
            return None
        left = self.retry_at - self.clock()
        if left > 0:
            return left
        self.retry_at = None
        return None

    def trip(self) -> None:
        """A send timed out: hold the next ``retry_s``."""
        self.retry_at = self.clock() + self.retry_s


def deadletter_gate(producer: Any) -> TopicGate:
    """``producer``'s gate, made at its first dead letter (a producer that takes no attribute: a new one each time,
    never gated, as before)."""
    gate = getattr(producer, _GATE_ATTR, None)
    if not isinstance(gate, TopicGate):
        gate = TopicGate()
        try:
            setattr(producer, _GATE_ATTR, gate)
        except AttributeError:
            pass
    return gate


# a consumed record's headers as kafka-python gives them (``ConsumerRecord.headers``)
RecordHeaders = Sequence[tuple[str, bytes | None]]


def send_deadletter(producer: Any, kafka: KafkaSettings, reason: str, *, source_topic: str,
                    partition: int | None, offset: int | None, key: bytes | None, value: Any,
                    stage: str, log: Any, headers: RecordHeaders | None = None,
                    value_is: ValueIs | None = None) -> None:
    """Keep a consumed record a service refused on the dead-letter topic, in the stream stage's
    shape (:func:`opsloop.records.deadletter_record`). ``headers``: the consumed record's (a replay's
    ``opsloop-replayed-from`` becomes ``replayed_from``: refused again, not a new failure); ``value_is``:
    what ``value`` holds (``record``: its bytes, replayable). Never raises nor waits: the caller has counted
    the refusal already, and a broker hiccup must not stop the service. A dead letter not written (``send``
    raised, or its future failed later: the broker refused it, the delivery timed out) is counted once in
    :data:`~opsloop.deadletter_metrics.DEADLETTER_SEND_FAILURES` and logged ``deadletter_failed``.

    A ``send`` blocks the producer's ``max_block_ms`` when the dead-letter topic has no metadata (not created, on
    brokers that do not auto-create) or the buffer is full: a stream of bad records stalled the service that long per
    record. After one such timeout the producer's dead letters of the next :data:`DEADLETTER_UNAVAILABLE_RETRY_S`
    are counted lost at once, not sent; then the topic is tried again."""
    where = {"stage": stage, "source_topic": source_topic, "partition": partition, "offset": offset}
    gate = deadletter_gate(producer)
    if (left := gate.held()) is not None:
        _deadletter_lost(log, where, KafkaTimeoutError(
            f"not sent: the dead-letter topic's last send timed out, tried again in {left:.0f}s"))
        return
    try:
        future = producer.send(kafka.topic(Topic.DEADLETTER), key=deadletter_key(key), value=deadletter_record(
            reason, topic=source_topic, partition=partition, offset=offset, key=key, value=value,
            stage=stage, replayed_from=replayed_from_header(headers), value_is=value_is))
    except KafkaTimeoutError as e:
        gate.trip()
        DEADLETTER_SEND_FAILURES.labels(stage).inc()   # said at once, not sampled: at most once a minute per producer
        log.error("deadletter_failed", **where,
                  consequence=f"dead letters of the next {DEADLETTER_UNAVAILABLE_RETRY_S:g}s counted lost, not sent",
                  error=f"{type(e).__name__}: {e}"[:300])
        return
    except Exception as e:  # noqa: BLE001
        _deadletter_lost(log, where, e)
        return
    # kafka-python's FutureRecordMetadata: the errback runs on the producer's I/O thread (at once if
    # the future has failed already)
    add_errback = getattr(future, "add_errback", None)
    if add_errback is not None:
        add_errback(_deadletter_lost, log, where)


def _deadletter_lost(log: Any, where: dict[str, Any], error: BaseException) -> None:
    DEADLETTER_SEND_FAILURES.labels(where["stage"]).inc()
    # a poison topic with a broken dead-letter topic loses one per record: one line a minute per source topic
    DEADLETTER_LOST_LOG.error(log, "deadletter_failed", key=f"{where['stage']}:{where['source_topic']}", **where,
                              error=f"{type(error).__name__}: {error}"[:300])
