"""Create opsloop's Kafka topics up front (idempotent), from the wire format's topic list.

Producers and Faust agents then never wait on a metadata refresh for a topic that a later
producer would auto-create, and partition counts are the configured ones, not the broker default.

Every wait of the admin client is bounded by ``timeout_s``: its bootstrap too, which kafka-python's own default
held 30 s whatever the caller asked, with no broker answering (a collector's sender thread, and every round behind
it, waited that long). No retry loop here: a creation that could not be made is said (``topics_not_created``,
``deferred``) and tried again by the caller at its next connection.
"""

from __future__ import annotations

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import (KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError, RequestTimedOutError,
                          TopicAlreadyExistsError)

from opsloop.config import KafkaSettings
from opsloop.kafka_clients import client_options, kafka_settings
from opsloop.topics import Topic
from opsloop.log import EventLogger

# the admin's waits (bootstrap, listing, creation) each; the callers reach it once a broker answered their own client
DEFAULT_TIMEOUT_S = 10.0
# no broker answered within the time-out: the creation is put off, not refused
_UNREACHABLE = (KafkaTimeoutError, KafkaConnectionError, NodeNotReadyError, RequestTimedOutError)
RETRIED = "with the caller's next Kafka client (a collector: its next producer, after a failed send; a service: " \
          "its next start)"


def ensure_topics(kafka: KafkaSettings | str, partitions: int, replication_factor: int = 1,
                  topics: list[str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Create the missing ones (``kafka.topic_prefix`` applied to every name); returns the names created. Each wait
    (the bootstrap, the listing, the creation) takes at most ``timeout_s``."""
    k = kafka_settings(kafka)
    names = [k.topic(n) for n in (topics if topics is not None else [t.value for t in Topic])]
    ms = max(1, int(timeout_s * 1000))
    admin = KafkaAdminClient(request_timeout_ms=ms, bootstrap_timeout_ms=ms, client_id="opsloop-topics",
                             **client_options(k))
    try:
        existing = set(admin.list_topics())
        missing = [n for n in names if n not in existing]
        if missing:
            try:
                admin.create_topics([NewTopic(n, partitions, replication_factor) for n in missing], timeout_ms=ms)
            except TopicAlreadyExistsError:  # a concurrent creator won the race: fine
                pass
        return missing
    finally:
        admin.close()


def ensure_configured_topics(kafka: KafkaSettings, log: EventLogger, topics: list[str] | None = None,
                             timeout_s: float = DEFAULT_TIMEOUT_S, retried: str = RETRIED, **fields: object) -> bool:
    """:func:`ensure_topics` with ``kafka``'s configured partitions and replication factor, said in the log: the
    names created (``topics_created``), or why none could be (``topics_not_created``: no right to create topics,
    say, or no broker answering within ``timeout_s``: ``deferred``, tried again as ``retried`` says; the clients
    then work with what exists). Never raises; False when the creation failed."""
    try:
        created = ensure_topics(kafka, kafka.partitions, kafka.replication_factor, topics, timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001 - the caller goes on with the topics that exist
        names = [kafka.topic(t) for t in (topics if topics is not None else [t.value for t in Topic])]
        unreachable = isinstance(e, _UNREACHABLE)
        log.warning("topics_not_created", **fields, topics=names, error=f"{type(e).__name__}: {e}"[:300],
                    deferred=unreachable, timeout_s=timeout_s, retried=retried,
                    consequence=(f"no broker answered within {timeout_s:g}s: creation deferred" if unreachable
                                 else "refused") + "; the clients go on with the topics that exist")
        return False
    if created:
        log.info("topics_created", **fields, topics=created, partitions=kafka.partitions,
                 replication_factor=kafka.replication_factor)
    return True
