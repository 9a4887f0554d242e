"""`opsloop deadletter replay --yes` whose source topic is deleted while it runs, against the real Kafka of the stack.

The cluster's topics are listed once, at the start. Before, a source topic deleted during the replay was not seen:
the stack's broker auto-creates topics and kafka-python's producer asks it to (it ignores
``allow_auto_create_topics=False``), so the next send re-created the topic with the broker's default partitions,
the rest of the records went there, "replay: 10 of 10 selected sent and acknowledged" and exit 0 (on a broker that
does not auto-create, every later send failed, each after --timeout). Now the replay looks for its topics as it
goes: it stops at the deletion, reports what was sent, exits 1, and the topic stays deleted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import orjson
import pytest
from kafka import KafkaAdminClient

from opsloop import deadletter_cli
from opsloop.cli import main
from tests.core.test_deadletter_replay_interrupted import INTERRUPT_AFTER, RECORDS, setup_topics
from tests.core.test_deadletter_replay_loop import restore_logging  # noqa: F401 (the fixture)
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def delete_after(bootstrap: str, topic: str, n: int) -> object:
    """``Reader.letters`` that deletes ``topic`` (and waits until the cluster says so) after ``n`` dead letters."""
    original = deadletter_cli.Reader.letters

    def letters(self: deadletter_cli.Reader) -> Iterator[deadletter_cli.Letter]:
        for i, letter in enumerate(original(self)):
            if i == n:
                admin = KafkaAdminClient(bootstrap_servers=bootstrap)
                try:
                    admin.delete_topics([topic])
                finally:
                    admin.close()
                wait_until(lambda: topic not in topics(bootstrap), timeout=60, what=f"{topic} deleted")
            yield letter
    return letters


@pytest.mark.parametrize("as_json", [False, True])
def test_a_source_topic_deleted_mid_replay_stops_it_with_the_progress_so_far(
        tmp_path: Path, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        restore_logging: None, as_json: bool) -> None:
    config, lb, dl = setup_topics(tmp_path, kafka_bootstrap)
    monkeypatch.setattr(deadletter_cli.Reader, "letters", delete_after(kafka_bootstrap, lb, INTERRUPT_AFTER))
    monkeypatch.setattr(deadletter_cli, "LOOK_EVERY_S", 0.0, raising=False)   # a look before each letter
    code = main(["deadletter", "replay", "--config", str(config), "--source-topic", "telemetry.lb", "--yes",
                 "--timeout", "5", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    # before: exit 0, every record "sent", the topic back
    assert code == 1, out + err
    assert lb not in topics(kafka_bootstrap), "the deleted source topic was re-created"
    report = err if as_json else out
    assert f"replay STOPPED: {INTERRUPT_AFTER} of {INTERRUPT_AFTER} selected sent and acknowledged, 0 failed" \
        in report, report
    assert f"source topic {lb} was deleted during the replay; stopped: the dead letters after these were not " \
           "replayed" in report, report
    assert "deadletter_replay_topic_deleted" in err
    if as_json:
        *lines, summary = [orjson.loads(line) for line in out.splitlines()]
        assert [(x["deadletter"], x["status"]) for x in lines] == [(f"{dl}/0/{i}", "sent")
                                                                   for i in range(INTERRUPT_AFTER)]
        assert summary["summary"]["deleted_topics"] == [lb] and summary["summary"]["stopped"] is True
        assert summary["summary"]["selected"] == INTERRUPT_AFTER < RECORDS
    else:
        sent = [line.split()[1] for line in out.splitlines() if line.startswith("sent ")]
        assert sent == [f"{dl}/0/{i}" for i in range(INTERRUPT_AFTER)]


def test_sends_between_two_looks_fail_and_do_not_re_create_the_topic(
        tmp_path: Path, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        restore_logging: None) -> None:
    """The records sent after the deletion and before the next look: failed, each named, not sent to a topic the
    broker made anew; the deletion is said at the end."""
    config, lb, dl = setup_topics(tmp_path, kafka_bootstrap)
    monkeypatch.setattr(deadletter_cli.Reader, "letters", delete_after(kafka_bootstrap, lb, INTERRUPT_AFTER))
    monkeypatch.setattr(deadletter_cli, "LOOK_EVERY_S", 3600.0, raising=False)   # no look until its end
    code = main(["deadletter", "replay", "--config", str(config), "--source-topic", "telemetry.lb", "--yes",
                 "--timeout", "5"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    assert code == 1, out + err
    # before: the broker re-created it at the first send after the deletion, the 6 records "sent" there
    assert lb not in topics(kafka_bootstrap), "the deleted source topic was re-created"
    failed = RECORDS - INTERRUPT_AFTER
    assert f"replay: {INTERRUPT_AFTER} of {RECORDS} selected sent and acknowledged, {failed} failed" in out, out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("failed ")] == [
        f"{dl}/0/{i}" for i in range(INTERRUPT_AFTER, RECORDS)]
    assert f"source topic {lb} was deleted during the replay; a new replay says" in out, out
