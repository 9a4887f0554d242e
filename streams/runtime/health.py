"""The stream worker's own health metrics: events in, samples, dead-lettered, errors, lag, batch sizes."""

from __future__ import annotations

from typing import Iterable

from prometheus_client import Counter, Gauge, Histogram

RECORDS_IN = Counter("opsloop_stream_records_total", "Kafka records consumed", ["topic"])
SAMPLES_IN = Counter("opsloop_stream_samples_total", "Valid samples processed", ["topic"])
DEADLETTERED = Counter("opsloop_stream_deadlettered_total", "Records or samples sent to the dead-letter topic",
                       ["topic"])
# the topic label of a dead letter that came off no record (a handler's summary of samples not retried)
NO_SOURCE_TOPIC = "handler"


def deadletter_series(topics: Iterable[str]) -> None:
    """The dead-letter counter's series of each source topic (and of the handlers) exist at 0 from the agent's
    start: OpsloopDeadLetterGrowing takes their increase(), which a series born at its first dead letter never
    shows (a first bad record on a clean topic was not alerted)."""
    topics = tuple(topics)
    for topic in (*topics, NO_SOURCE_TOPIC):
        DEADLETTERED.labels(topic)
    for topic in topics:   # ... and the samples': OpsloopTelemetrySilent sees a topic silent since a restart
        SAMPLES_IN.labels(topic)


ERRORS = Counter("opsloop_stream_errors_total", "Handler errors (the samples a handler fails on are dead-lettered, the worker goes on)",
                 ["agent"])
STATE_HOME_UNKNOWN = Counter("opsloop_stream_state_home_unknown_total",
                             "Detector state writes of a key whose home partition was unknown or has had no event "
                             "on this worker yet (written where it was touched)", ["agent"])
STATE_HOME_MOVED = Counter("opsloop_stream_state_home_moved_total",
                           "Detector state keys whose records came from another partition than the one their "
                           "state lived in (moved there, the old copy deleted)", ["agent"])
LAG = Gauge("opsloop_stream_consumer_lag", "Records between the last processed offset and the high-water mark",
            ["topic", "partition"])
# Set for every held source partition by streams/runtime/progress.py, batch or not: a partition nobody
# processes shows as a committed offset that does not move under uncommitted records (OpsloopStreamPartitionStuck).
# group: the consumer group (the app id): two groups reading one topic are two partitions' progress, not one
COMMITTED_OFFSET = Gauge("opsloop_stream_committed_offset",
                         "The group's committed offset of a source partition this worker holds (its log-start "
                         "offset while nothing was committed)", ["group", "topic", "partition"])
UNCOMMITTED = Gauge("opsloop_stream_uncommitted_records",
                    "Records of a source partition this worker holds between the group's committed offset and the "
                    "high-water mark", ["group", "topic", "partition"])
COMMITS_REFUSED = Counter("opsloop_stream_commits_refused_total",
                          "Offset commits the group refused (this member's generation had ended): their records are "
                          "read again by the partitions' owner (streams/runtime/transport.py)")
BATCH_SIZE = Histogram("opsloop_stream_batch_records", "Records per processed batch", ["agent"],
                       buckets=(1, 10, 100, 500, 1000, 2000, 5000, 10000))
BATCH_SECONDS = Histogram("opsloop_stream_batch_seconds", "Time to process one batch", ["agent"],
                          buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
LAST_BATCH = Gauge("opsloop_stream_last_batch_timestamp_seconds", "When the agent last processed a batch",
                   ["agent"])
EVENT_AGE = Gauge("opsloop_stream_sample_age_seconds", "Now minus the newest sample's event time, per topic",
                  ["topic"])
RECOVERY_REMAINING = Gauge("opsloop_stream_recovery_remaining_records",
                           "Changelog records the table recovery still has to read (0 when not recovering)")
HANDED_OFF = Counter("opsloop_stream_records_handed_off_total",
                     "Records taken but left to their partition's owner: reason rebalanced (their generation ended "
                     "in the buffer) or evicted (this worker was out of its group after a pause)", ["reason"])
RECOVERY_ACTIONS = Counter("opsloop_stream_recovery_actions_total",
                           "Recovery watchdog actions: gap_skipped, reseek, exit (the worker exits for its supervisor)",
                           ["action"])
