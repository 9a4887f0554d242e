"""`opsloop deadletter list|summary|replay` against the real Kafka of the stack fixture.

Each test has a topic prefix of its own (``kafka.topic_prefix``), so its dead-letter topic holds only the
records it wrote; the command is run in-process through `opsloop`'s own entry point.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

from opsloop import deadletter_cli
from opsloop.cli import main
from opsloop.deadletter_cli import (DeadLetterError, Letter, NotReplayable, decode_letter,
                                    normalise_reason, original_key, original_value, render_lines)
from opsloop.kafka_admin import ensure_topics
from opsloop.kafka_security import KafkaSecurity, kafka_python_options
from opsloop.records import deadletter_record
from opsloop.records.deadletter import REPLAYED_FROM_HEADER
from opsloop.stack import free_port
from opsloop.streams.runtime.batch import DeadLetter, decode_messages
from opsloop.topics import Topic
from tests.helpers import ConsumerMsg, create_topics, read_topic, run_cli, unique, write_config
from tests.kafka_secure import USERS, SecureBroker

pytestmark = pytest.mark.integration

HOUR_MS = 3600 * 1000


class Env:
    """A config with a prefix of its own; produces dead letters and runs the command."""

    def __init__(self, tmp_path: Path, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.prefix = unique("dl") + "."
        self.config = write_config(tmp_path / "opsloop.yaml", {
            "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": self.prefix}})
        self.dl_topic = f"{self.prefix}{Topic.DEADLETTER.value}"
        self.lb = f"{self.prefix}{Topic.LB.value}"

    def create_lb(self) -> None:
        """The source topic a replay sends to (it sends only to a topic that exists)."""
        create_topics(self.bootstrap, self.lb)

    def produce(self, *records: tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, int],
                topic: str | None = None) -> list[tuple[int, int]]:
        """Write (key, value[, timestamp_ms]) records; their (partition, offset)."""
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        try:
            futures = [producer.send(topic or self.dl_topic, key=r[0], value=r[1],
                                     timestamp_ms=r[2] if len(r) > 2 else None) for r in records]
            producer.flush()
            return [(md.partition, md.offset) for md in (f.get(timeout=30) for f in futures)]
        finally:
            producer.close()

    def run(self, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
        code = main(["deadletter", *argv, "--config", str(self.config)])
        out, err = capsys.readouterr()
        assert "Traceback" not in err, err
        return code, out, err


def letter(reason: str, *, source: str, partition: int | None = 2, offset: int | None = 17,
           key: bytes | None = b"lb-1", value: Any = b'{"name": "haproxy"}', stage: str = "stream",
           at: float | None = None) -> bytes:
    raw = deadletter_record(reason, topic=source, partition=partition, offset=offset, key=key, value=value,
                            stage=stage)
    if at is None:
        return raw
    doc = orjson.loads(raw)
    doc["received_at"] = at
    return orjson.dumps(doc)


@pytest.fixture
def env(tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    monkeypatch.setenv("COLUMNS", "200")   # the terminal `list` fits its lines to
    # the command sends every logger to the stderr of its run (setup_logging): put pytest's handlers back,
    # or the next test's client threads log into a captured stream already closed
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield Env(tmp_path, kafka_bootstrap)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def finishes(fn: Any, limit_s: float = 60.0) -> Any:
    """``fn()``'s result, failing (not hanging) if it has not returned within ``limit_s`` (a deadline)."""
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    t.start()
    t.join(limit_s)
    assert result, f"still running after {limit_s} s"
    return result[0]


# ------------------------------------------------------------------------------------ list and summary


def test_list_prints_each_dead_letter_oldest_first_and_summary_counts_alike_reasons_once(
        env: Env, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    env.produce(
        (b"lb-1", letter("metrics.3.fields: Input should be a valid dictionary (got 'x')", source=env.lb,
                         at=now - 30)),
        (b"lb-2", letter("metrics.7.fields: Input should be a valid dictionary (got 'yy')", source=env.lb,
                         key=b"lb-2", partition=1, offset=4, at=now - 20)),
        (None, letter("finding 3f2a9c01b7d4e5f6 could not be paged: KeyError: 'labels'",
                      source=f"{env.prefix}findings", key=None, stage="paging", at=now - 10)),
    )
    code, out, err = env.run(capsys, "list")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 3, out
    assert "metrics.3.fields" in lines[0] and "metrics.7.fields" in lines[1] and "could not be paged" in lines[2]
    assert time.strftime("%Y-%m-%dT", time.gmtime(now - 30)) in lines[0]
    assert " stream " in lines[0] and f"{env.lb}/2/17" in lines[0] and lines[0].endswith("key=lb-1")
    assert f"{env.lb}/1/4" in lines[1] and lines[1].endswith("key=lb-2")
    assert " paging " in lines[2] and lines[2].endswith("key=-")
    assert "3 dead letters matched" in err
    # a narrow terminal: the reason is cut so that the line, key included, fits
    monkeypatch.setenv("COLUMNS", "110")
    code, out, err = env.run(capsys, "list")
    lines = out.splitlines()
    assert code == 0 and all(len(line) <= 110 for line in lines), out
    assert "metrics.3.fields: Input" in lines[0] and "…  key=lb-1" in lines[0]

    code, out, err = env.run(capsys, "list", "--json")
    docs = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0 and [d["key"] for d in docs] == ["lb-1", "lb-2", None]
    assert all(d["deadletter"].startswith(f"{env.dl_topic}/") for d in docs)

    code, out, err = env.run(capsys, "summary", "--json")
    groups = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0, err
    assert [(g["count"], g["stage"], g["source_topic"], g["reason"]) for g in groups] == [
        (2, "stream", env.lb, "metrics.N.fields: Input should be a valid dictionary (got '…')"),
        (1, "paging", f"{env.prefix}findings", "finding <id> could not be paged: KeyError: '…'")]
    code, out, _ = env.run(capsys, "summary")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["COUNT", "STAGE", "SOURCE"]
    assert out.splitlines()[1].split()[:3] == ["2", "stream", env.lb]


def test_filters_reason_stage_source_topic_and_limit(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    env.produce(
        (b"a", letter("not JSON: unexpected character", source=env.lb, key=b"a", at=now - 40)),
        (b"b", letter("empty record", source=env.lb, key=b"b", at=now - 30)),
        (b"c", letter("Not json either", source=f"{env.prefix}telemetry.ipmi", key=b"c", at=now - 20)),
        (b"d", letter("decision refused", source=f"{env.prefix}edge.weights", key=b"d", stage="actuator",
                      at=now - 10)),
    )

    def keys(*argv: str) -> list[str]:
        code, out, err = env.run(capsys, "list", "--json", *argv)
        found = [orjson.loads(line)["key"] for line in out.splitlines()]
        assert code == (0 if found else 1), err
        return found

    assert keys("--reason", "NOT JSON") == ["a", "c"]                        # case-insensitive substring
    assert keys("--stage", "actuator") == ["d"]
    assert keys("--source-topic", "telemetry.lb") == ["a", "b"]              # base name: the prefix applied
    assert keys("--source-topic", env.lb, "--reason", "empty") == ["b"]      # the name on the cluster
    assert keys("--stage", "paging") == []
    assert keys("--limit", "2") == ["c", "d"]                                # the newest two, oldest first
    code, _, err = env.run(capsys, "list", "--limit", "2")
    assert "4 dead letters matched, the newest 2 shown" in err


def test_since_starts_the_read_at_that_time(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    old_ms = int((now - 3 * 3600) * 1000)
    env.produce(
        (b"old", letter("old one", source=env.lb, key=b"old", at=now - 3 * 3600), old_ms),
        (b"new", letter("new one", source=env.lb, key=b"new", at=now - 60), int((now - 60) * 1000)),
    )
    for argv, expected in ((["list"], ["new"]), (["list", "--since", "4h"], ["old", "new"]),
                           (["list", "--since", "all"], ["old", "new"]), (["list", "--since", "90s"], ["new"])):
        code, out, err = env.run(capsys, *argv, "--json")
        assert code == 0 and [orjson.loads(line)["key"] for line in out.splitlines()] == expected, (argv, err)
    code, out, _ = env.run(capsys, "summary", "--json")   # 24h by default
    assert code == 0 and sum(orjson.loads(line)["count"] for line in out.splitlines()) == 2


def test_no_topic_or_an_empty_one_returns_at_once_with_exit_1(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    # nothing ever dead-lettered under this prefix: no topic at all
    code, out, err = finishes(lambda: env.run(capsys, "list", "--since", "all"))
    assert (code, out) == (1, "") and "0 dead letters matched" in err
    # the topic exists and is empty (an idle topic): the end offsets are where the read starts
    ensure_topics(env.bootstrap, partitions=3, topics=[env.dl_topic])
    for command in ("list", "summary"):
        code, out, err = finishes(lambda: env.run(capsys, command))
        assert (code, out) == (1, "") and "0 dead letters matched" in err, command
    code, out, err = finishes(lambda: env.run(capsys, "replay", "--source-topic", "telemetry.lb", "--yes"))
    assert code == 0 and "0 of 0 selected sent" in out, out + err


def test_an_unreadable_dead_letter_is_named_and_skipped_and_the_good_ones_read(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    future = orjson.loads(letter("from a newer opsloop", source=env.lb))
    env.create_lb()
    future["schema_version"] = 2
    places = env.produce(
        (b"g", b"not json at all"),
        (b"g", b"[1, 2]"),
        (b"g", orjson.dumps(future)),
        (b"g", orjson.dumps({"reason": "half a record", "stage": "stream"})),
        (b"g", orjson.dumps({**orjson.loads(letter("bad offset", source=env.lb)), "offset": "seven"})),
        (b"g", None),
        (b"g", letter("the good one", source=env.lb, key=b"g")),
    )
    code, out, err = env.run(capsys, "list", "--since", "all")
    assert code == 0 and len(out.splitlines()) == 1 and "the good one" in out, out + err
    where = [f"{env.dl_topic}/{p}/{o}" for p, o in places]
    expected = ["not JSON", "a JSON list, expected an object", "schema_version 2 is newer than this opsloop reads (1)",
                "missing fields: source_topic, partition, offset, key, received_at",
                "offset: expected an integer >= 0 or null, got 'seven'", "record has no value (tombstone)"]
    for place, why in zip(where, expected):
        assert any(place in line and why in line for line in err.splitlines()), (place, why, err)
    assert "1 dead letter matched, 6 unreadable skipped" in err
    code, out, err = env.run(capsys, "summary", "--since", "all", "--json")
    assert code == 0 and [orjson.loads(line)["count"] for line in out.splitlines()] == [1]
    code, out, err = env.run(capsys, "replay", "--since", "all", "--source-topic", "telemetry.lb")
    assert code == 0 and "1 of 1 selected would be sent" in out and "6 unreadable dead letters skipped" in out


def test_a_long_read_reports_its_progress_on_stderr(env: Env, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # a report after every poll that leaves records to read (a poll returns at most 2000: 5000 take three)
    monkeypatch.setattr(deadletter_cli, "PROGRESS_EVERY_S", 0.0)
    env.produce(*[(b"k%d" % (i % 7), letter(f"bad {i}", source=env.lb)) for i in range(5000)])
    code, out, err = env.run(capsys, "summary", "--json")
    assert code == 0 and orjson.loads(out)["count"] == 5000, err
    progress = [line for line in err.splitlines() if line.startswith(f"reading {env.dl_topic}: ")]
    assert progress and all(re.fullmatch(r"reading \S+: [\d,]+ of 5,000 records \(\d+ %\)", line) for line in progress)
    assert out.count("\n") == 1   # progress never on stdout


def test_bad_options_and_an_unreachable_broker_are_one_line_exit_2(env: Env,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        env.run(capsys, "list", "--since", "5x")
    assert e.value.code == 2 and "--since '5x': expected a duration" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        env.run(capsys, "replay")                                  # --source-topic is required
    assert e.value.code == 2 and "--source-topic" in capsys.readouterr().err
    code, _, err = env.run(capsys, "replay", "--source-topic", "telemetry.deadletter")
    assert code == 2 and "is the dead-letter topic itself" in err
    code, _, err = env.run(capsys, "replay", "--source-topic", " ")   # would match a handler's summary record
    assert code == 2 and err.strip() == "opsloop deadletter replay: --source-topic is empty"
    r = run_cli("deadletter", "list", "--bootstrap", f"127.0.0.1:{free_port()}", "--timeout", "2", timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("opsloop deadletter list: Kafka at 127.0.0.1:"), r.stderr


# ------------------------------------------------------------------------------------ replay


def test_replay_without_yes_sends_nothing(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.produce((b"lb-1", letter("not JSON: x", source=env.lb)),
                (b"lb-1", letter("too big", source=env.lb, value=b"x" * 70_000)))
    env.create_lb()
    code, out, err = env.run(capsys, "replay", "--source-topic", "telemetry.lb")
    assert code == 0, err
    assert f"would send  {env.dl_topic}/" in out and f"->  {env.lb}  key=lb-1  19 bytes" in out
    assert "dry run: 1 of 2 selected would be sent, 1 skipped (1 truncated" in out
    assert "nothing was sent (--yes sends)" in out
    assert read_topic(env.bootstrap, env.lb) == []


def test_replay_yes_sends_the_exact_bytes_and_key_with_a_header_and_never_a_truncated_record(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    text = b'{"name": "haproxy", "tags": {"host": "lb-1"}, "fields": {"x": "\xc3\xa9"}, "timestamp": 1}'
    binary = b"\xff\xfe\x00 not UTF-8 \x80"
    env.create_lb()
    places = env.produce(
        (b"lb-1", letter("not JSON: a", source=env.lb, key=b"lb-1", value=text)),
        (b"lb-2", letter("not JSON: b", source=env.lb, key=b"lb-2", value=binary)),
        (None, letter("empty-ish", source=env.lb, key=None, value=b" ")),
        (b"lb-3", letter("too big", source=env.lb, key=b"lb-3", value=b"y" * 70_000)),
        (b"lb-4", letter("metrics.1.fields: bad", source=env.lb, key=b"lb-4", value={"name": "haproxy"})),
        (b"\xff", letter("bad key", source=env.lb, key=b"\xffk", value=b"{}")),
        (b"ip", letter("not JSON: other topic", source=f"{env.prefix}telemetry.ipmi", key=b"ip", value=b"z")),
    )
    code, out, err = env.run(capsys, "replay", "--source-topic", "telemetry.lb", "--yes")
    assert code == 0, out + err
    assert "replay: 3 of 6 selected sent and acknowledged, 0 failed, 3 skipped" in out
    assert "1 truncated: only the first bytes of the record were kept" in out
    assert "1 the dead letter holds a sample or an excerpt, not the record's bytes" in out
    assert "1 key was not UTF-8" in out
    sent = {r.key: r for r in read_topic(env.bootstrap, env.lb)}
    assert set(sent) == {b"lb-1", b"lb-2", None}
    assert sent[b"lb-1"].value == text and sent[b"lb-2"].value == binary and sent[None].value == b" "
    for key, (p, o) in zip((b"lb-1", b"lb-2", None), places):
        assert sent[key].headers == [(REPLAYED_FROM_HEADER, f"{env.dl_topic}/{p}/{o}".encode())]
    assert read_topic(env.bootstrap, f"{env.prefix}telemetry.ipmi") == []   # not selected
    # --json: a line per record and the counts
    code, out, _ = env.run(capsys, "replay", "--source-topic", "telemetry.lb", "--reason", "not json", "--json")
    lines = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0 and [x["status"] for x in lines[:-1]] == ["would send", "would send"]
    assert lines[-1]["summary"] == {"dry_run": True, "selected": 2, "would_send": 2, "failed": 0, "skipped": {},
                                    "no_topic": {}, "unreadable": 0}


def test_a_send_the_broker_refuses_is_reported_and_exits_1(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=env.bootstrap)
    try:   # the source topic takes records of at most 1000 bytes: a 5000-byte record is refused for good
        admin.create_topics([NewTopic(env.lb, 1, 1, topic_configs={"max.message.bytes": "1000"})])
    finally:
        admin.close()
    env.produce((b"big", letter("not JSON: big", source=env.lb, key=b"big", value=b"{" * 5000)))
    code, out, err = env.run(capsys, "replay", "--source-topic", "telemetry.lb", "--yes", "--timeout", "5")
    assert code == 1, out + err
    assert "failed" in out and "MessageSizeTooLarge" in out, out
    assert "replay: 0 of 1 selected sent and acknowledged, 1 failed" in out
    assert read_topic(env.bootstrap, env.lb) == []


def test_a_replay_refused_again_is_marked_counted_and_replayed_only_with_force(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    (p, o), = env.produce((b"lb-1", letter("not JSON: x", source=env.lb, at=now - 30)))
    env.create_lb()
    origin = f"{env.dl_topic}/{p}/{o}"
    again = {**orjson.loads(letter("not JSON: x", source=env.lb, at=now - 10)), "replayed_from": origin}
    (p2, o2), = env.produce((b"lb-1", orjson.dumps(again)))
    code, out, err = env.run(capsys, "list")
    lines = out.splitlines()
    assert code == 0 and "replayed-from" not in lines[0] and lines[1].endswith(f"replayed-from={origin}  key=lb-1")
    assert "2 dead letters matched, 1 refused again after a replay" in err
    code, out, err = env.run(capsys, "summary", "--json")
    assert code == 0 and [(g["count"], g["after_replay"]) for g in map(orjson.loads, out.splitlines())] == [(2, 1)]
    code, out, err = env.run(capsys, "summary")
    assert out.splitlines()[0].split()[-4:] == ["NEWEST", "AFTER", "REPLAY", "REASON"]
    assert out.splitlines()[1].split()[4:6] == ["1", "not"]
    code, out, err = env.run(capsys, "replay", "--source-topic", "telemetry.lb", "--yes")
    assert code == 0 and "replay: 1 of 2 selected sent and acknowledged, 0 failed, 1 skipped" in out, out + err
    assert (f"skipped     {env.dl_topic}/{p2}/{o2}  ->  {env.lb}  key=lb-1  refused again after a replay of {origin}: "
            "fix the cause first, or --force") in out
    assert [r.headers for r in read_topic(env.bootstrap, env.lb)] == [[(REPLAYED_FROM_HEADER, origin.encode())]]
    code, out, err = env.run(capsys, "replay", "--source-topic", "telemetry.lb", "--force")
    assert code == 0 and "dry run: 2 of 2 selected would be sent, 0 skipped" in out, out + err


def test_stream_dead_letters_that_do_not_hold_the_record_as_it_was_are_never_replayed(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """The stream stage's dead letters (its own builder): a key over 1024 bytes is kept cut and flagged,
    a bad sample of a batch is kept as that sample; before, replay sent the cut key (another partition,
    another state key) and the sample's text as if it were the record."""
    long_key = b"lb-" + b"k" * 1997
    env.create_lb()
    bad = [ConsumerMsg(env.lb, 0, 5, long_key, b"{not json"),
           ConsumerMsg(env.lb, 0, 6, b"lb-s", orjson.dumps({"schema_version": 1, "metrics": ["not a sample"]})),
           ConsumerMsg(env.lb, 0, 7, b"lb-ok", b"{not json")]
    letters = decode_messages(bad, now=time.time()).deadletters
    env.produce(*[(dl.key, dl.encode()) for dl in letters])
    code, out, err = env.run(capsys, "replay", "--source-topic", "telemetry.lb", "--yes")
    assert code == 0 and "replay: 1 of 3 selected sent and acknowledged, 0 failed, 2 skipped" in out, out + err
    assert [(r.key, r.value) for r in read_topic(env.bootstrap, env.lb)] == [(b"lb-ok", b"{not json")]
    assert "key truncated: only the first 1024 of its 2000 bytes were kept" in out     # said per record
    assert "1 key truncated: only its first bytes were kept" in out                   # and counted
    assert "key=lb-s  the dead letter holds one sample of the record (a bad sample of a batch" in out
    docs = [orjson.loads(dl.encode()) for dl in letters]
    assert docs[0]["key_truncated"] is True and docs[0]["key_bytes"] == 2000 and len(docs[0]["key"]) == 1024
    assert [d.get("value_is") for d in docs] == ["record", "sample", "record"] and docs[1]["value"] == "not a sample"
    code, out, err = env.run(capsys, "list")
    assert code == 0 and out.splitlines()[0].endswith("… (cut, 2000 bytes)"), out


def test_an_old_dead_letter_without_the_newer_fields_is_read_listed_and_replayed(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    old = {"schema_version": 1, "reason": "not JSON: x", "stage": "stream", "source_topic": env.lb, "partition": 1,
           "offset": 3, "key": "lb-1", "received_at": time.time() - 5, "value": "{x", "truncated": False}
    env.produce((b"lb-1", orjson.dumps(old)))
    env.create_lb()
    assert decode_letter(orjson.dumps(old)) == old
    code, out, err = env.run(capsys, "list")
    assert code == 0 and f"{env.lb}/1/3" in out and out.rstrip().endswith("key=lb-1") and "replayed-from" not in out
    assert "1 dead letter matched" in err and "after a replay" not in err
    code, out, _ = env.run(capsys, "summary", "--json")
    assert code == 0 and orjson.loads(out)["after_replay"] == 0
    code, out, err = env.run(capsys, "replay", "--source-topic", "telemetry.lb", "--yes")
    assert code == 0 and "replay: 1 of 1 selected sent and acknowledged" in out, out + err
    assert [(r.key, r.value) for r in read_topic(env.bootstrap, env.lb)] == [(b"lb-1", b"{x")]


# ------------------------------------------------------------------------------------ the record itself


def test_reasons_are_grouped_by_what_does_not_vary() -> None:
    assert normalise_reason("metrics.12.timestamp: 1.7e12 is 400 s ahead (name 'ipmi_power')") == \
        "metrics.N.timestamp: N is N s ahead (name '…')"
    assert normalise_reason("3 of 10 samples rejected (7 kept): metrics.1.fields: x (got 'a'); metrics.4.y: z") == \
        "several samples rejected, first: metrics.N.fields: x (got '…')"
    assert normalise_reason("handler detectors rejected: power-detector: s3_frontend ipv4") == \
        "handler detectors rejected: power-detector: s3_frontend ipv4"
    assert normalise_reason("finding 0b8e2c9a-41d2-4c1e-9f3a-5d6e7f809aa1 could not be paged") == \
        "finding <id> could not be paged"


def test_what_cannot_be_replayed_exactly_is_refused_with_why() -> None:
    def doc(**kw: Any) -> dict[str, Any]:
        return decode_letter(letter("r", source="telemetry.lb", **kw))

    assert original_value(doc(value=b"\x00\xff")) == b"\x00\xff"
    assert original_key(doc(key=b"k\xc3\xa9")) == "ké".encode()
    for kw, why in (({"value": b"a" * 70_000}, "truncated"), ({"value": None}, "no value"),
                    ({"value": {"a": 1}}, "excerpt"), ({"value": [1]}, "excerpt")):
        with pytest.raises(NotReplayable, match=why):
            original_value(doc(**kw))
    with pytest.raises(NotReplayable, match="not UTF-8"):
        original_key(doc(key=b"\xfe"))
    # the stream stage says what its value holds: a sample's text is no record, though a string
    for kind, why in (("sample", "one sample of the record"), ("samples", "excerpt of the record's rejected"),
                      ("summary", "a handler's summary"), ("later-kind", "value_is 'later-kind'")):
        raw = DeadLetter("bad", "telemetry.lb", 0, 1, b"k", "not a sample", value_is=kind).encode()  # type: ignore
        with pytest.raises(NotReplayable, match=why):
            original_value(decode_letter(raw))
    assert original_value(decode_letter(DeadLetter("bad", "t", 0, 1, b"k", b"{x", value_is="record").encode())) == b"{x"
    with pytest.raises(NotReplayable) as e:
        original_key(doc(key=b"k" * 1025))
    assert str(e.value) == "key truncated: only its first bytes were kept"   # alike records counted as one
    assert e.value.detail == "key truncated: only the first 1024 of its 1025 bytes were kept"   # this one
    assert original_key(doc(key=b"k" * 1024)) == b"k" * 1024


@pytest.mark.parametrize("field, value, why", [
    ("replayed_from", 7, "replayed_from: expected a string or null, got 7"),
    ("key_truncated", "yes", "key_truncated: expected true or false, got 'yes'"),
    ("key_bytes", -1, "key_bytes: expected an integer >= 0, got -1"),
    ("key_bytes", True, "key_bytes: expected an integer >= 0, got True"),
    ("value_is", ["sample"], "value_is: expected a string or null, got ['sample']"),
])
def test_a_newer_field_of_the_wrong_type_is_named(field: str, value: Any, why: str) -> None:
    raw = orjson.dumps({**orjson.loads(letter("r", source="telemetry.lb")), field: value})
    with pytest.raises(DeadLetterError, match=re.escape(why)):
        decode_letter(raw)


# ------------------------------------------------------------------------------------ TLS and SASL


@pytest.fixture
def secure(secure_kafka: SecureBroker) -> SecureBroker:
    return secure_kafka   # the session's (conftest), shared with the other SASL_SSL modules


def test_the_kafka_security_settings_of_the_config_are_used(secure: SecureBroker, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    user, password = USERS["scram"]
    sec = KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", username=user, password=password,
                        ssl_cafile=secure.ca)
    prefix = unique("sec") + "."
    config = write_config(tmp_path / "opsloop.yaml", {"kafka": {
        "bootstrap_servers": secure.bootstrap, "topic_prefix": prefix,
        "security": {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "username": user,
                     "ssl_cafile": str(secure.ca)}}})
    source = f"{prefix}{Topic.LB.value}"
    admin = KafkaAdminClient(bootstrap_servers=secure.bootstrap, **kafka_python_options(sec))
    try:   # the replay sends only to a source topic that exists
        admin.create_topics([NewTopic(source, 1, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=secure.bootstrap, acks="all", **kafka_python_options(sec))
    try:
        producer.send(f"{prefix}{Topic.DEADLETTER.value}", key=b"lb-1",
                      value=letter("not JSON: x", source=source)).get(timeout=60)
    finally:
        producer.close()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        monkeypatch.setenv("OPSLOOP__KAFKA__SECURITY__PASSWORD", password)   # as a service takes it
        assert main(["deadletter", "list", "--config", str(config)]) == 0
        out, err = capsys.readouterr()
        assert f"{source}/2/17" in out and out.rstrip().endswith("key=lb-1"), out + err
        assert main(["deadletter", "replay", "--source-topic", "telemetry.lb", "--yes", "--config", str(config)]) == 0
        out, err = capsys.readouterr()
        assert "1 of 1 selected sent and acknowledged" in out, out + err
        monkeypatch.setenv("OPSLOOP__KAFKA__SECURITY__PASSWORD", "not-the-password")
        assert main(["deadletter", "summary", "--config", str(config), "--timeout", "8"]) == 2
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and lines[0].startswith("opsloop deadletter summary: "), err
        assert "rejected the login" in lines[0] and "not-the-password" not in err
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    consumer = KafkaConsumer(source, bootstrap_servers=secure.bootstrap, group_id=None, auto_offset_reset="earliest",
                             consumer_timeout_ms=20_000, **kafka_python_options(sec))
    try:
        got = [(m.key, m.value) for m in consumer]
    finally:
        consumer.close()
    assert got == [(b"lb-1", b'{"name": "haproxy"}')]


def test_text_from_a_record_cannot_break_the_line_or_drive_the_terminal() -> None:
    doc = decode_letter(letter("bad\x1b[2J\rvalue", source="telemetry.lb", key=b"k\nx"))
    [line] = render_lines([Letter("telemetry.deadletter", 0, 5, doc)], 200)
    assert "\x1b" not in line and "\r" not in line and "bad\\x1b[2J value" in line and line.endswith("key=k\\x0ax")
