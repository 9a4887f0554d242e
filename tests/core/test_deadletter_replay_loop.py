"""A dead letter stays traceable through a replay, with the real stream worker on the stack's Kafka.

Records refused by the worker are replayed with `opsloop deadletter replay`; one is refused again, and its
second dead letter names the dead letter it was replayed from (the ``opsloop-replayed-from`` header the
worker read through Faust), so `list` and `summary` tell it from a new failure and `replay` leaves it.
A record whose key the dead letter had to cut, or whose dead letter holds one sample of a batch, is never
sent back (before: the cut key and the sample's text were sent as if they were the record).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from opsloop.cli import main
from opsloop.stack import ManagedProcess, Stack, free_port
from opsloop.streams.runtime.batch import decode_messages
from opsloop.topics import Topic
from tests.helpers import metrics_up, opsloop_process, read_topic, unique, wait_until, write_config

pytestmark = pytest.mark.integration

LONG_KEY = b"lb-" + b"k" * 1997   # 2000 bytes: over the dead letter's 1024


@pytest.fixture
def restore_logging() -> Iterator[None]:
    # the command sends every logger to the stderr of its run (setup_logging): put pytest's handlers back
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def run(capsys: pytest.CaptureFixture[str], config: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["deadletter", *argv, "--config", str(config)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def dead_letters(bootstrap: str, topic: str, n: int) -> list[tuple[Any, dict[str, Any]]]:
    """The first ``n`` dead letters of ``topic`` (waited for: the worker writes them), each with its record."""
    found = wait_until(lambda: len(rs := read_topic(bootstrap, topic)) >= n and rs, timeout=120,
                       what=f"{n} dead letters on {topic}")
    return [(r, orjson.loads(r.value)) for r in found]


def test_a_replay_refused_again_names_its_origin_and_is_not_replayed_again(
        stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    bootstrap = stack.kafka_bootstrap
    prefix = unique("dlr") + "."
    port = free_port()
    config = write_config(tmp_path / "opsloop.yaml", {
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": prefix, "partitions": 2},
        "stream": {"app_id": unique("opsloop-test"), "data_dir": str(tmp_path / "streams"), "metrics_port": port,
                   "web_port": free_port(), "batch_within_s": 0.2}})
    source, dl_topic = f"{prefix}{Topic.LB.value}", f"{prefix}{Topic.DEADLETTER.value}"
    batch_with_a_bad_sample = orjson.dumps({"schema_version": 1, "metrics": ["not a sample"]})
    worker: ManagedProcess = opsloop_process("stream-worker", ["stream", "worker", "--config", str(config)],
                                             tmp_path / "worker", ready=lambda: metrics_up(port))
    worker.start()
    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        try:
            for key, value in ((b"lb-again", b"{not json"), (LONG_KEY, b"{not json either"),
                               (b"lb-sample", batch_with_a_bad_sample)):
                producer.send(source, key=key, value=value).get(timeout=30)
        finally:
            producer.close()
        by_key = {doc["key"][:9]: (r, doc) for r, doc in dead_letters(bootstrap, dl_topic, 3)}
        long_doc = by_key["lb-kkkkkk"][1]
        assert long_doc["key_truncated"] is True and long_doc["key_bytes"] == 2000 and len(long_doc["key"]) == 1024
        assert by_key["lb-sample"][1]["value_is"] == "sample" and by_key["lb-again"][1]["value_is"] == "record"
        assert all("replayed_from" not in doc for _, doc in by_key.values())
        origin_rec = by_key["lb-again"][0]
        origin = f"{dl_topic}/{origin_rec.partition}/{origin_rec.offset}"

        code, out, err = run(capsys, config, "replay", "--source-topic", "telemetry.lb", "--since", "all", "--yes")
        assert code == 0, out + err
        assert "replay: 1 of 3 selected sent and acknowledged, 0 failed, 2 skipped" in out, out
        assert "key truncated: only the first 1024 of its 2000 bytes were kept" in out
        assert "the dead letter holds one sample of the record" in out
        replayed = [r for r in read_topic(bootstrap, source) if r.headers]
        assert [(r.key, r.value) for r in replayed] == [(b"lb-again", b"{not json")]   # no cut key, no sample

        # the worker refuses the replayed copy again: its dead letter says which dead letter it came from
        [again] = [d for _, d in dead_letters(bootstrap, dl_topic, 4) if d.get("replayed_from")]
        assert (again["replayed_from"], again["key"]) == (origin, "lb-again") and again["reason"].startswith("not JSON")

        code, out, err = run(capsys, config, "list", "--since", "all")
        assert code == 0, err
        [line] = [line for line in out.splitlines() if "replayed-from=" in line]
        assert f"replayed-from={origin}  key=lb-again" in line
        assert "4 dead letters matched, 1 refused again after a replay" in err
        code, out, err = run(capsys, config, "summary", "--since", "all", "--json")
        groups = [orjson.loads(line) for line in out.splitlines()]
        assert code == 0 and sum(g["after_replay"] for g in groups) == 1 and sum(g["count"] for g in groups) == 4
        code, out, err = run(capsys, config, "summary", "--since", "all")
        assert "AFTER REPLAY" in out.splitlines()[0]

        # replaying it again is refused, saying why; --force sends it (a dry run here)
        code, out, err = run(capsys, config, "replay", "--source-topic", "telemetry.lb", "--since", "all",
                             "--reason", "not JSON", "--json")
        lines = [orjson.loads(line) for line in out.splitlines()]
        status = {(x["key"][:9], x["status"]): x["detail"] for x in lines[:-1]}
        assert code == 0 and set(status) == {("lb-again", "would send"), ("lb-again", "skipped"),
                                             ("lb-kkkkkk", "skipped")}, lines
        assert status[("lb-again", "skipped")] == \
            f"refused again after a replay of {origin}: fix the cause first, or --force"
        assert lines[-1]["summary"]["skipped"] == {
            "key truncated: only its first bytes were kept": 1,
            "refused again after a replay: fix the cause first, or --force": 1}
        code, out, err = run(capsys, config, "replay", "--source-topic", "telemetry.lb", "--since", "all",
                             "--reason", "not JSON", "--force")
        assert code == 0 and "dry run: 2 of 3 selected would be sent, 1 skipped (1 key truncated" in out, out
        assert worker.running()
    finally:
        worker.stop()


class Msg:
    """A consumed kafka-python record as the runtime reads it (topic, partition, offset, key, value, headers)."""

    def __init__(self, record: Any) -> None:
        self.topic, self.partition, self.offset = record.topic, record.partition, record.offset
        self.key, self.value, self.headers = record.key, record.value, record.headers


def test_the_dead_letter_builder_reads_the_replay_header_of_a_consumed_record(kafka_bootstrap: str) -> None:
    topic = unique("dlh")
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        for headers in ([("opsloop-replayed-from", b"x.telemetry.deadletter/1/42")], [("other", b"1")], []):
            producer.send(topic, key=b"k", value=b"{bad", headers=headers).get(timeout=30)
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=10_000)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        records = [next(consumer) for _ in range(3)]
    finally:
        consumer.close()
    letters = decode_messages([Msg(r) for r in records], now=time.time()).deadletters
    docs = [orjson.loads(dl.encode()) for dl in letters]
    assert [d.get("replayed_from") for d in docs] == ["x.telemetry.deadletter/1/42", None, None]
