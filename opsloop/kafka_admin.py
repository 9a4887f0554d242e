"""Create opsloop's Kafka topics up front (idempotent), from the wire format's topic list.

Producers and Faust agents then never wait on a metadata refresh for a topic that a later
producer would auto-create, and partition counts are the configured ones, not the broker default.
"""

from __future__ import annotations

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from opsloop.config import KafkaSettings
from opsloop.kafka_clients import client_options, kafka_settings
from opsloop.topics import Topic
from opsloop.log import EventLogger


def ensure_topics(kafka: KafkaSettings | str, partitions: int, replication_factor: int = 1,
                  topics: list[str] | None = None, timeout_s: float = 30.0) -> list[str]:
    """Create the missing ones (``kafka.topic_prefix`` applied to every name); returns the names created."""
    k = kafka_settings(kafka)
    names = [k.topic(n) for n in (topics if topics is not None else [t.value for t in Topic])]
    admin = KafkaAdminClient(request_timeout_ms=int(timeout_s * 1000), client_id="opsloop-topics",
                             **client_options(k))
    try:
        existing = set(admin.list_topics())
        missing = [n for n in names if n not in existing]
        if missing:
            try:
                admin.create_topics([NewTopic(n, partitions, replication_factor) for n in missing],
                                    timeout_ms=int(timeout_s * 1000))
            except TopicAlreadyExistsError:  # a concurrent creator won the race: fine
                pass
        return missing
    finally:
        admin.close()


def ensure_configured_topics(kafka: KafkaSettings, log: EventLogger, topics: list[str] | None = None,
                             timeout_s: float = 30.0, **fields: object) -> bool:
    """:func:`ensure_topics` with ``kafka``'s configured partitions and replication factor, said in the log: the
    names created (``topics_created``), or why none could be (``topics_not_created``: no right to create topics,
    say; the clients then work with what exists). Never raises; False when the creation failed."""
    try:
        created = ensure_topics(kafka, kafka.partitions, kafka.replication_factor, topics, timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001 - the caller goes on with the topics that exist
        names = [kafka.topic(t) for t in (topics if topics is not None else [t.value for t in Topic])]
        log.warning("topics_not_created", **fields, topics=names, error=f"{type(e).__name__}: {e}"[:300])
        return False
    if created:
        log.info("topics_created", **fields, topics=created, partitions=kafka.partitions,
                 replication_factor=kafka.replication_factor)
    return True
