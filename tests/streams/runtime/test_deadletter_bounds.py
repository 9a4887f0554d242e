"""A dead letter stays far below Kafka's 1 MB message limit (a larger one is refused by the producer: the
bad record would leave no trace), and still names the first thing wrong. Before: a 0.25 MB record with
20,000 bad fields gave a 5 MB dead letter (its reason alone), and a refused sample was carried whole."""

from __future__ import annotations

import time

import orjson
import pytest

from opsloop.records import DEADLETTER_VALUE_LIMIT, metric
from opsloop.streams.runtime.batch import DEADLETTER_REASON_CHARS, DeadLetter, decode_messages

from tests.helpers import ConsumerMsg

KAFKA_MAX = 1_000_000
NOW = time.time()
CASES = {
    "fields": {"name": "x", "tags": {}, "fields": {f"f{i}": [1] for i in range(20000)}, "timestamp": NOW},
    "tags": {"name": "x", "tags": {f"t{i}": 1 for i in range(20000)}, "fields": {"v": 1}, "timestamp": NOW},
    "batch": {"schema_version": 1, "metrics": [{"name": "x", "fields": {f"f{i}": [1] for i in range(20000)},
                                                "timestamp": NOW}]},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_large_bad_record_gives_a_dead_letter_under_1mb_naming_the_first_error(case: str) -> None:
    raw = orjson.dumps(CASES[case])
    (dl,) = decode_messages([ConsumerMsg("telemetry.ipmi", 0, 1, b"k", raw)]).deadletters
    enc = dl.encode()
    assert len(enc) < KAFKA_MAX
    doc = orjson.loads(enc)
    first = {"fields": "fields.f0", "tags": "tags.t0", "batch": "metrics.0.fields.f0"}[case]
    assert doc["reason"].startswith(first) or f": {first}" in doc["reason"][:300]
    assert "more errors" in doc["reason"]
    assert (doc["source_topic"], doc["offset"]) == ("telemetry.ipmi", 1)


def test_a_refused_oversize_sample_and_reason_are_cut_and_say_so() -> None:
    sample = metric("haproxy", {"status": "DOWN" + " " * 2_000_000}, {"host": "e1"}, NOW)
    dl = DeadLetter("handler lb rejected: " + "why " * 500_000, "telemetry.lb", 0, 7, b"k" * 2_000_000,
                    sample.to_dict())
    enc = dl.encode()
    assert len(enc) < KAFKA_MAX
    doc = orjson.loads(enc)
    assert doc["reason"].startswith("handler lb rejected: why why")
    assert doc["reason"].endswith("characters cut)") and len(doc["reason"]) < DEADLETTER_REASON_CHARS + 100
    assert doc["truncated"] is True and doc["value_bytes"] > 2_000_000
    assert doc["value"].startswith('{"name":"haproxy"') and len(doc["value"]) <= DEADLETTER_VALUE_LIMIT
    assert (doc["source_topic"], doc["offset"]) == ("telemetry.lb", 7)


def test_a_small_dead_letter_is_unchanged() -> None:
    dl = DeadLetter("bad", "t", 0, 1, b"k", {"a": 1})
    doc = orjson.loads(dl.encode())
    assert (doc["reason"], doc["value"], doc["key"]) == ("bad", {"a": 1}, "k") and "truncated" not in doc


def test_a_str_value_is_bounded_like_bytes() -> None:
    doc = orjson.loads(DeadLetter("bad", "t", 0, 1, None, "v" * 2_000_000).encode())
    assert doc["truncated"] is True and len(doc["value"]) == DEADLETTER_VALUE_LIMIT
