"""The size guard of the ``detector-state`` writes, no broker (the real worker: ``test_state_too_large_live.py``).

A state whose changelog record the producer would refuse (aiokafka: ``MessageSizeTooLargeError`` above
``producer_max_request_size``, inside Faust's producer buffer task, which crashed the worker) is not written: it
stays in memory, counted ``opsloop_stream_state_dropped_total{reason="too_large"}``. The guard weighs the record
as aiokafka does (the bytes the table's codecs make, plus record and batch overhead), not an estimate: a state of
non-ASCII text is 2-4 times its length in characters. A key whose records moved to another partition keeps its
old copy while its state is refused (deleted there, before, with nothing written in its place: a restart started
it afresh and its open findings were never cleared)."""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from prometheus_client import REGISTRY

from opsloop.config import Settings
from opsloop.streams.agents.findings_sink import ActiveFindings, FindingsSink
from opsloop.streams.agents.stateful import KEY_SEP, StatefulAgent, state_table
from opsloop.streams.detectors.netperf.handler import NetperfHandler
from tests.streams.agents.test_runtime import loop_for
from tests.streams.agents.test_state_home_moved import BASE, KEY, drop_open, measured
from tests.streams.agents.test_state_partition import T0, ChangelogTable

LIMIT = 20_000   # a small producer_max_request_size: states cross it in a few KB


async def no_send(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
    raise AssertionError("no finding expected")


def refused_total(handler: str) -> float:
    return REGISTRY.get_sample_value("opsloop_stream_state_dropped_total",
                                     {"handler": handler, "reason": "too_large"}) or 0.0


def producer_refuses(agent: StatefulAgent, table_key: str, state: Any) -> bool:
    """Whether aiokafka's producer, at the app's max request size, refuses the bytes Faust's write sends."""
    topic = agent.table.changelog_topic
    key, _ = topic.prepare_key(table_key, agent.table.key_serializer, None, {})
    value, _ = topic.prepare_value(state, agent.table.value_serializer, None, {})

    async def check() -> bool:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", max_request_size=agent.max_record_bytes)
        try:
            producer._serialize(key, value, [])
        except MessageSizeTooLargeError:
            return True
        return False
    return asyncio.run(check())


@pytest.mark.parametrize("char", ["x", "é", "€", "🙂", "\u2028"])
def test_the_guard_refuses_exactly_what_the_producer_refuses(char: str) -> None:
    app = faust.App("state-too-large", broker="kafka://127.0.0.1:1", value_serializer="raw",
                    producer_max_request_size=LIMIT)
    sink = FindingsSink(no_send, ActiveFindings())
    agent = StatefulAgent(app, [NetperfHandler()], Settings(), state_table(app), sink)  # type: ignore[arg-type]
    assert agent.max_record_bytes == LIMIT   # the producer's own setting
    table_key = f"netperf-detector{KEY_SEP}six-vms-{char}"

    def size(n: int) -> int:
        size = agent.record_size(table_key, {"pad": char * n, "n": n})
        assert size is not None
        return size
    lo, hi = 0, LIMIT   # the longest padding the producer takes: size(lo) <= LIMIT < size(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(mid) <= LIMIT else (lo, mid)
    for n in (lo - 1, lo, hi, hi + 1):
        state = {"pad": char * n, "n": n}
        assert (size(n) > agent.max_record_bytes) == producer_refuses(agent, table_key, state), (char, n, size(n))
    assert producer_refuses(agent, table_key, {"pad": char * hi, "n": hi})
    assert not producer_refuses(agent, table_key, {"pad": char * lo, "n": lo})


class SizedChangelogTable(ChangelogTable):
    """The changelog fake with the real table's changelog topic and codecs (what the guard serialises with)."""

    def __init__(self, real: Any) -> None:
        super().__init__()
        self.changelog_topic, self.key_serializer, self.value_serializer = (
            real.changelog_topic, real.key_serializer, real.value_serializer)


def test_a_state_too_large_is_not_written_and_a_moved_key_keeps_its_old_copy_until_a_write_goes_through() -> None:
    app = faust.App("state-too-large-moved", broker="kafka://127.0.0.1:1", value_serializer="raw")
    table = SizedChangelogTable(state_table(app))
    agent = loop_for(NetperfHandler(), table, [])
    asyncio.run(agent.run_batch([measured("bench-1", 1, 0, BASE, T0)]))
    asyncio.run(agent.run_batch([measured("bench-1", 1, 1, {8: 3.5}, T0 + 3600)]))   # the drop opens
    assert drop_open(table[KEY]) and table.partitions_of(KEY) == {1}
    written, before = len(table.log), refused_total("netperf-detector")

    # bench-2 (partition 0) measures the set now, the drop clears; its state is over the limit
    agent.max_record_bytes = 300   # a netperf state is ~1-3 KB
    asyncio.run(agent.run_batch([measured("bench-2", 0, 0, {8: 8.4}, T0 + 7200)]))
    assert len(table.log) == written, table.log[written:]   # neither written nor its old copy deleted (was: both)
    assert refused_total("netperf-detector") == before + 1 and agent.too_large == 1
    assert drop_open(table.recovered([0, 1]).get(KEY))       # a restart: the old copy, its open drop to clear
    assert agent._home["netperf-detector"]["six-vms"] == 1    # the move waits for a write that goes through

    # the state fits again: the next write moves it, the old copy deleted (one copy)
    agent.max_record_bytes = app.conf.producer_max_request_size
    asyncio.run(agent.run_batch([measured("bench-2", 0, 1, {8: 8.4}, T0 + 7300)]))
    assert table.log[written:] == [(1, KEY, None), (0, KEY, table[KEY])]
    assert not drop_open(table[KEY])
    for order in ([1, 0], [0, 1]):
        recovered = table.recovered(order).get(KEY)
        assert recovered is None or recovered == table[KEY], order
