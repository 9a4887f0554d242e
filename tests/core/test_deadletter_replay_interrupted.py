"""`opsloop deadletter replay --yes` interrupted mid-way (Ctrl-C, SIGTERM), against the real Kafka of the stack.

An interrupted replay must say what it sent: a replay is at-least-once (docs/operations.md), so the operator
needs to know how far it got. Before, Ctrl-C left with exit 130 and no word (the records handed to the producer
were still delivered by its close), and SIGTERM killed the process outright.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from kafka import KafkaProducer

from opsloop import deadletter_cli
from opsloop.cli import main
from opsloop.records import deadletter_record
from opsloop.records.deadletter import REPLAYED_FROM_HEADER
from opsloop.topics import Topic
from tests.core.test_deadletter_replay_loop import restore_logging  # noqa: F401 (the fixture)
from tests.helpers import REPO, create_topics, read_topic, unique, write_config

pytestmark = pytest.mark.integration

RECORDS = 10
INTERRUPT_AFTER = 4   # dead letters read before the interrupt


def setup_topics(tmp_path: Path, bootstrap: str, batch_each: bool = False) -> tuple[Path, str, str]:
    """A config with a prefix of its own, RECORDS replayable dead letters of its lb topic; (config, lb, dl).
    ``batch_each``: each dead letter in a batch of its own (a read then fetches them a few at a time)."""
    prefix = unique("dlint") + "."
    config = write_config(tmp_path / "opsloop.yaml", {"kafka": {"bootstrap_servers": bootstrap,
                                                                "topic_prefix": prefix}})
    lb, dl = f"{prefix}{Topic.LB.value}", f"{prefix}{Topic.DEADLETTER.value}"
    create_topics(bootstrap, lb, dl, partitions=1)   # one partition: the dead letters are read in order
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i in range(RECORDS):
            producer.send(dl, key=f"lb-{i}".encode(),
                          value=deadletter_record("handler: boom", topic=lb, partition=0, offset=i,
                                                  key=f"lb-{i}".encode(), value=f'{{"n": {i}}}'.encode()))
            if batch_each:
                producer.flush(timeout=30)
        producer.flush(timeout=30)
    finally:
        producer.close()
    return config, lb, dl


def interrupted_letters(interrupt: Any) -> Any:
    """``Reader.letters`` that calls ``interrupt()`` after INTERRUPT_AFTER dead letters (an operator's Ctrl-C)."""
    original = deadletter_cli.Reader.letters

    def letters(self: deadletter_cli.Reader) -> Iterator[deadletter_cli.Letter]:
        for n, letter in enumerate(original(self)):
            if n == INTERRUPT_AFTER:
                interrupt()
            yield letter
    return letters


def check_report(out: str, bootstrap: str, lb: str, dl: str) -> None:
    """What the replay says it sent is what the topic holds: the first INTERRUPT_AFTER, once each."""
    on_topic = read_topic(bootstrap, lb)
    assert sorted(r.key for r in on_topic) == [f"lb-{i}".encode() for i in range(INTERRUPT_AFTER)]
    assert f"replay INTERRUPTED: {INTERRUPT_AFTER} of {INTERRUPT_AFTER} selected sent and acknowledged, " \
           "0 failed, 0 skipped" in out, out
    assert f"a new replay sends the {INTERRUPT_AFTER} sent here again" in out, out
    sent_lines = [line for line in out.splitlines() if line.startswith("sent ")]
    assert [line.split()[1] for line in sent_lines] == [f"{dl}/0/{i}" for i in range(INTERRUPT_AFTER)]
    for r in on_topic:
        origin = dict(r.headers)[REPLAYED_FROM_HEADER].decode()
        assert f"{origin}  ->  {lb}  key={r.key.decode()}" in out


def test_ctrl_c_mid_replay_waits_for_what_was_sent_and_reports_it(
        tmp_path: Path, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        restore_logging: None) -> None:
    config, lb, dl = setup_topics(tmp_path, kafka_bootstrap)

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(deadletter_cli.Reader, "letters", interrupted_letters(ctrl_c))
    code = main(["deadletter", "replay", "--config", str(config), "--source-topic", "telemetry.lb", "--yes"])
    out, err = capsys.readouterr()
    assert code == 130, out + err
    assert "Traceback" not in err, err
    check_report(out, kafka_bootstrap, lb, dl)


SIGTERM_RUN = """
import os, signal, sys
from opsloop import deadletter_cli
from opsloop.cli import main
from tests.core.test_deadletter_replay_interrupted import interrupted_letters
deadletter_cli.Reader.letters = interrupted_letters(lambda: os.kill(os.getpid(), signal.SIGTERM))
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_mid_replay_is_reported_like_ctrl_c(tmp_path: Path, kafka_bootstrap: str) -> None:
    config, lb, dl = setup_topics(tmp_path, kafka_bootstrap)
    done = subprocess.run([sys.executable, "-c", SIGTERM_RUN, "deadletter", "replay", "--config", str(config),
                           "--source-topic", "telemetry.lb", "--yes"],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ})
    # before: killed by the signal (-15), nothing said about the records already handed to Kafka
    assert done.returncode == 130, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    check_report(done.stdout, kafka_bootstrap, lb, dl)
