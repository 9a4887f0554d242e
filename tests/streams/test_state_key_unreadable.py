"""A ``detector-state`` changelog record whose key is no key the table writes (a JSON string) is refused, not
raised inside Faust's recovery: the table's key codec reads it as an ``UnreadableKey``, the recovery's changelog
callback logs it naming topic, partition and offset and counts it (``unreadable``, handler ``unknown``), and the
restore drops it from memory while the other keys are restored. The real worker and changelog:
``tests/streams/test_refused_state_on_kafka.py``.

Before (old code): Faust's ``json`` codec raised ``KeyDecodeError`` for such bytes inside the recovery (logged by
Faust as ``Error in recovery`` with neither topic nor offset, counted nowhere; the last record of its partition
held the recovery until the watchdog took its offset for a gap), and a JSON object as key raised ``TypeError``
(unhashable) at every flush of the recovery's buffer.
"""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import faust
import pytest

from opsloop.streams.agents import stateful
from opsloop.streams.agents.stateful import state_table
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from tests.streams.test_state_restore_fuzz import KINDS, T0, Outcome, Table, batch, built, logged, new_agent, \
    sim_clock, unreadable

NOT_KEYS = [b'"firewall-detector|hv-', b"\xff\xfe", b"", b"NaN", b'{"not": "a key"}', b"[1, 2]", b"17", b"null"]


class Message:
    headers: dict[str, bytes] = {}
    topic = "opsloop-detector-state-changelog"
    partition = 2
    offset = 41
    value = b'{"a": 1}'

    def __init__(self, key: bytes | None) -> None:
        self.key = key


def changelog_schema() -> tuple[faust.App, Any]:
    app = faust.App("state-key-codec", broker="kafka://127.0.0.1:1", value_serializer="raw")
    table = state_table(app)
    return app, table.changelog_topic.clone().schema   # the recovery reads a clone of the topic


@pytest.mark.parametrize("raw", NOT_KEYS)
def test_a_changelog_key_that_is_no_json_string_is_read_as_unreadable_not_raised(raw: bytes) -> None:
    app, schema = changelog_schema()
    key = schema.loads_key(app, Message(raw))
    assert isinstance(key, stateful.UnreadableKey), key
    assert hash(key) == hash(schema.loads_key(app, Message(raw))) and key == schema.loads_key(app, Message(raw))


def test_the_keys_the_table_writes_read_and_write_as_before() -> None:
    app, schema = changelog_schema()
    assert schema.loads_key(app, Message(b'"firewall-detector|hv-v"')) == "firewall-detector|hv-v"
    assert schema.loads_key(app, Message(None)) is None
    table = state_table(app)
    assert app.serializers.dumps_key(None, "power-detector|st-a", serializer=table.key_serializer) == \
        b'"power-detector|st-a"'


def test_the_recovery_callback_logs_where_the_record_lies_and_counts_it() -> None:
    app, schema = changelog_schema()
    msg = Message(b'"firewall-detector|hv-')
    event = app.create_event(schema.loads_key(app, msg), None, {}, msg)
    good = app.create_event("firewall-detector|hv-v", {"report": None}, {}, Message(b'"firewall-detector|hv-v"'))
    before = unreadable("unknown")
    with logged() as log:
        asyncio.run(state_table(app)._on_changelog_event(event))
        asyncio.run(state_table(app)._on_changelog_event(good))
    [line] = log.events("state_key_unreadable")
    assert (line["topic"], line["partition"], line["offset"]) == (Message.topic, 2, 41)
    assert "firewall-detector|hv-" in line["key"] and line["error"]
    assert unreadable("unknown") == before + 1


class StoreTable(Table):
    """The fuzz file's memory store, with Faust's ``table.data.data`` (the store's dict) that the restore drops
    a key from without a changelog write."""

    @property
    def data(self) -> SimpleNamespace:
        return SimpleNamespace(data=self)


def test_the_restore_drops_an_unreadable_key_and_restores_the_others() -> None:
    states, _ = built("firewall")
    table = StoreTable()
    dict.update(table, copy.deepcopy(states))
    bad = stateful.UnreadableKey("JSONDecodeError: torn", b'"firewall-detector|hv-')
    dict.__setitem__(table, bad, copy.deepcopy(states["firewall-detector|hv-o"]))
    out, letters = Outcome(), []
    agent = new_agent(table, out, letters, FirewallHandler())
    kind = KINDS["firewall"]
    with sim_clock(T0 + 3600), logged() as log:
        asyncio.run(agent.run_batch(batch(kind, kind.warm)))
    assert bad not in table and not log.events("state_restore_failed") and not letters
    assert {k for k in table} == set(states)
    assert not [e for e, f in out.published if e in ("opened", "cleared")]   # restored: nothing re-opened
