"""`opsloop deadletter replay --yes` whose dead-letter topic itself is deleted while it reads, against the real Kafka
of the stack.

Before, the read stalled (ReadStalled after --timeout) and the command exited 2 with "no progress" alone: not a word
of the records it had already sent back (a replay is at-least-once: the operator must know how far it got). Now it
is handled like a source topic deleted under the replay: it stops reading, waits for the acknowledgements of what it
sent, reports them, says the dead-letter topic was deleted, and exits 1; the topic is not re-created by the read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
from kafka import KafkaConsumer
from kafka.errors import KafkaError

from opsloop import deadletter_cli
from opsloop.cli import main
from tests.core import test_deadletter_replay_interrupted as interrupted
from tests.core.test_deadletter_replay_loop import restore_logging  # noqa: F401 (the fixture)
from tests.core.test_deadletter_replay_topic_deleted import delete_after, topics
from tests.helpers import create_topics, read_topic, wait_until

pytestmark = pytest.mark.integration

RECORDS = interrupted.RECORDS
DELETE_AFTER = 4   # dead letters read before the dead-letter topic is deleted


def setup_topics(tmp_path: Path, bootstrap: str) -> tuple[Path, str, str]:
    """RECORDS replayable dead letters, each in a batch of its own (so that the read fetches them a few at a time,
    not all before the deletion); (config, lb, dl)."""
    return interrupted.setup_topics(tmp_path, bootstrap, batch_each=True)


def small_fetches(**kw: Any) -> KafkaConsumer:
    """The reader's consumer, fetching one batch (here one dead letter) per request."""
    return KafkaConsumer(**kw, max_partition_fetch_bytes=1)


@pytest.fixture
def replay_setup(tmp_path: Path, kafka_bootstrap: str,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str, str]]:
    config, lb, dl = setup_topics(tmp_path, kafka_bootstrap)
    monkeypatch.setattr(deadletter_cli, "KafkaConsumer", small_fetches)
    monkeypatch.setattr(deadletter_cli.Reader, "letters", delete_after(kafka_bootstrap, dl, DELETE_AFTER))
    yield config, lb, dl


@pytest.mark.parametrize("as_json", [False, True])
def test_a_deadletter_topic_deleted_mid_replay_stops_it_with_the_progress_so_far(
        replay_setup: tuple[Path, str, str], kafka_bootstrap: str, capsys: pytest.CaptureFixture[str],
        restore_logging: None, as_json: bool) -> None:
    config, lb, dl = replay_setup
    code = main(["deadletter", "replay", "--config", str(config), "--source-topic", "telemetry.lb", "--yes",
                 "--timeout", "3", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    # before: exit 2, "no progress for 3 s", nothing of the records sent
    assert code == 1, out + err
    on_topic = sorted(r.key.decode() for r in read_topic(kafka_bootstrap, lb))
    report = err if as_json else out
    if as_json:
        *lines, summary = [orjson.loads(line) for line in out.splitlines()]
        sent = [x["key"] for x in lines if x["status"] == "sent"]
        assert summary["summary"]["deadletter_deleted"] is True and summary["summary"]["stopped"] is True
        assert summary["summary"]["sent"] == len(sent)
    else:
        sent = [line.split("key=")[1].split()[0] for line in out.splitlines() if line.startswith("sent ")]
    # what it says it sent is what the source topic holds, at least the letters read before the deletion
    assert sorted(sent) == on_topic and DELETE_AFTER <= len(sent) < RECORDS, (sent, on_topic)
    n = len(sent)
    assert f"replay STOPPED: {n} of {n} selected sent and acknowledged, 0 failed" in report, report
    assert f"dead-letter topic {dl} was deleted during the replay: the dead letters after these were not read" \
        in report, report
    assert "deadletter_replay_deadletter_deleted" in err, err
    assert dl not in topics(kafka_bootstrap), "the read re-created the deleted dead-letter topic"


def test_a_dry_run_says_it_too(replay_setup: tuple[Path, str, str], kafka_bootstrap: str,
                               capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    config, lb, dl = replay_setup
    code = main(["deadletter", "replay", "--config", str(config), "--source-topic", "telemetry.lb", "--timeout", "3"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    assert code == 1, out + err
    assert "dry run STOPPED: " in out and "nothing was sent (--yes sends)" in out, out
    assert f"dead-letter topic {dl} was deleted during the replay" in out, out
    assert read_topic(kafka_bootstrap, lb) == []


def recreate_after(bootstrap: str, topic: str, n: int) -> object:
    """``Reader.letters`` that deletes ``topic`` after ``n`` dead letters and creates it anew, empty (what a stage
    dead-lettering a record meanwhile does: its producer has the broker create the topic)."""
    deleting = delete_after(bootstrap, topic, n)

    def create() -> bool:
        try:
            create_topics(bootstrap, topic, partitions=1)
        except KafkaError:   # still being deleted
            return False
        return True

    def letters(self: deadletter_cli.Reader) -> Iterator[deadletter_cli.Letter]:
        for i, letter in enumerate(deleting(self)):   # type: ignore[operator]
            if i == n:
                wait_until(create, timeout=60, what=f"{topic} created anew")
                wait_until(lambda: topic in topics(bootstrap), timeout=60, what=f"{topic} listed")
            yield letter
    return letters


def test_a_deadletter_topic_made_anew_mid_replay_is_not_read_from_its_start(
        tmp_path: Path, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        restore_logging: None) -> None:
    """The new topic's offsets start again at 0: the read, beyond its end, was reset to its start and stalled
    there (exit 2, nothing of the records sent), or read the new topic's records as the old one's."""
    config, lb, dl = setup_topics(tmp_path, kafka_bootstrap)
    monkeypatch.setattr(deadletter_cli, "KafkaConsumer", small_fetches)
    monkeypatch.setattr(deadletter_cli.Reader, "letters", recreate_after(kafka_bootstrap, dl, DELETE_AFTER))
    code = main(["deadletter", "replay", "--config", str(config), "--source-topic", "telemetry.lb", "--yes",
                 "--timeout", "3"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    assert code == 1, out + err
    sent = [line.split("key=")[1].split()[0] for line in out.splitlines() if line.startswith("sent ")]
    assert sorted(sent) == sorted(r.key.decode() for r in read_topic(kafka_bootstrap, lb)), out
    assert f"replay STOPPED: {len(sent)} of {len(sent)} selected sent" in out, out
    assert f"dead-letter topic {dl} was deleted during the replay" in out, out
