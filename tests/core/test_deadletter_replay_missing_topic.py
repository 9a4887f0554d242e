"""`opsloop deadletter replay` into a source topic that no longer exists, against the real Kafka of the stack.

The stack's broker auto-creates topics (``auto.create.topics.enable``, its default) and kafka-python's producer
ignores ``allow_auto_create_topics=False``: before, a replay into a deleted topic re-created it with the broker's
default partitions, sent the record there, reported it "sent and acknowledged" and exited 0 (on a broker that
does not auto-create, each send waited --timeout). Now the cluster's topics are listed once before sending and
such a record is named ("no topic"), counted, not sent, and the topic is not re-created; exit 1.
"""

from __future__ import annotations


import orjson
import pytest
from kafka import KafkaAdminClient

from tests.core.test_deadletter_cli import Env, env, letter  # noqa: F401 (env: the fixture)
from tests.helpers import create_topics, read_topic, unique, wait_until

pytestmark = pytest.mark.integration


def topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def test_a_dead_letter_whose_source_topic_was_deleted_is_not_replayed_and_the_topic_not_recreated(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    create_topics(env.bootstrap, env.lb, partitions=3)
    (p, o), = env.produce((b"lb-1", letter("not JSON: x", source=env.lb)))
    where = f"{env.dl_topic}/{p}/{o}"
    admin = KafkaAdminClient(bootstrap_servers=env.bootstrap)
    try:   # the stage was decommissioned, or its topic deleted to be re-made: the dead letter outlives it
        admin.delete_topics([env.lb])
    finally:
        admin.close()
    wait_until(lambda: env.lb not in topics(env.bootstrap), timeout=60, what=f"{env.lb} deleted")
    no_topic = f"no topic    {where}  ->  {env.lb}  key=lb-1  source topic {env.lb} does not exist: not replayed"

    code, out, err = env.run(capsys, "replay", "--source-topic", "telemetry.lb")   # a dry run says so too
    assert code == 1 and no_topic in out.splitlines(), out + err
    assert f"dry run: 0 of 1 selected would be sent, 0 skipped, 1 not replayed (no such source topic: {env.lb} (1))" \
        in out, out

    code, out, err = env.run(capsys, "replay", "--source-topic", "telemetry.lb", "--yes")
    # before: exit 0, "replay: 1 of 1 selected sent and acknowledged", the topic back with the default partitions
    assert code == 1 and no_topic in out.splitlines(), out + err
    assert f"replay: 0 of 1 selected sent and acknowledged, 0 failed, 0 skipped, 1 not replayed " \
           f"(no such source topic: {env.lb} (1))" in out, out
    assert "deadletter_replay_topic_missing" in err and env.lb in err
    assert env.lb not in topics(env.bootstrap)

    code, out, err = env.run(capsys, "replay", "--source-topic", "telemetry.lb", "--yes", "--json")
    *lines, summary = [orjson.loads(line) for line in out.splitlines()]
    assert code == 1 and lines == [{"deadletter": where, "topic": env.lb, "key": "lb-1", "status": "no topic",
                                    "detail": f"source topic {env.lb} does not exist: not replayed"}], out
    assert summary["summary"] == {"dry_run": False, "selected": 1, "sent": 0, "failed": 0, "skipped": {},
                                  "no_topic": {env.lb: 1}, "unreadable": 0}
    assert env.lb not in topics(env.bootstrap)


def test_only_the_records_of_a_missing_topic_are_held_back(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """--source-topic X selects X and <prefix>X: a dead letter naming the unprefixed X (a hostile or stray one)
    is not sent there, the others are."""
    base = unique("dlmiss")
    prefixed = f"{env.prefix}{base}"
    create_topics(env.bootstrap, prefixed)
    env.produce((b"k-1", letter("not JSON: a", source=prefixed, key=b"k-1", value=b"{a")),
                (b"k-2", letter("not JSON: b", source=base, key=b"k-2", value=b"{b")),
                (b"k-3", letter("not JSON: c", source=prefixed, key=b"k-3", value=b"{c")))
    code, out, err = env.run(capsys, "replay", "--source-topic", base, "--yes", "--json")
    *lines, summary = [orjson.loads(line) for line in out.splitlines()]
    assert code == 1, out + err
    assert sorted((x["key"], x["status"], x["topic"]) for x in lines) == [
        ("k-1", "sent", prefixed), ("k-2", "no topic", base), ("k-3", "sent", prefixed)]
    assert summary["summary"]["sent"] == 2 and summary["summary"]["no_topic"] == {base: 1}
    assert "2 of 3 selected sent and acknowledged, 0 failed, 0 skipped, 1 not replayed" in err
    assert sorted((r.key, r.value) for r in read_topic(env.bootstrap, prefixed)) == [(b"k-1", b"{a"), (b"k-3", b"{c")]
    assert base not in topics(env.bootstrap)
