"""The one-time move at the upgrade to generation keys, on one worker (the agent loop on a changelog that logs
each write to its partition, as Faust's does).

Readings were keyed by host, so each server's state (state key: the host) lived in its host's partition.
Keyed by generation, the readings of every server of a generation come from one partition: the first of them
moves each server's state there and deletes (tombstones) the copy in the old partition. Nothing is re-opened
or lost while the worker runs: no finding is published as ``opened`` or ``cleared`` by the move. A restart
recovers the state after the move whichever partition it recovers last (the newer copy wins:
tests/streams/agents/test_state_newest_copy.py); never the copy from before the move.
"""

from __future__ import annotations

import asyncio

from bench.stream_workload import Msg
from opsloop.records import Finding, Metric, metric
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.detectors.power.settings import PowerSettings
from opsloop.wire import encode_batch
from tests.streams.agents.test_runtime import loop_for
from tests.streams.agents.test_state_partition import ChangelogTable, Event

T0 = 1_795_500_000.0
FLEET = {"stor-a": (205.0, 0), "stor-b": (200.0, 1), "stor-c": (210.0, 2), "stor-x": (320.0, 3)}   # W, old partition
GEN_PARTITION = 2   # the generation's key's


def _reading(host: str, ts: float) -> Metric:
    return metric("ipmi_power", {"watts": FLEET[host][0]}, {"host": host, "generation": "gen2",
                                                            "raw_capacity_tb": "48"}, ts)


def _by_host(ts: float, offset: int) -> list[Event]:
    return [Event(Msg("telemetry.ipmi", p, offset, h.encode(), encode_batch([_reading(h, ts)])))
            for h, (_, p) in FLEET.items()]


def _by_generation(ts: float, offset: int) -> list[Event]:
    return [Event(Msg("telemetry.ipmi", GEN_PARTITION, offset, b"gen2",
                      encode_batch([_reading(h, ts) for h in FLEET])))]


def _events(sent: list[tuple[bytes, bytes, list[tuple[str, bytes]]]]) -> list[tuple[str, str, str]]:
    out = []
    for _, value, headers in sent:
        f = Finding.decode(value)
        out.append((dict(headers)["event"].decode(), f.detector, f.where["host"]))
    return out


def test_the_move_to_generation_keys_keeps_each_servers_findings_in_one_copy() -> None:
    table = ChangelogTable()
    handler = PowerHandler(PowerSettings(min_generation_size=4))
    published: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = []   # what the agent publishes
    agent = loop_for(handler, table, published)
    for n in range(4):
        asyncio.run(agent.run_batch(_by_host(T0 + 60 * n, n)))
    before = {(f.detector, f.where["host"]): f.first_seen for f in handler.open_findings()}
    assert ("power.generation_deviation", "stor-x") in before and len(before) == 5
    published.clear()
    for n in range(4, 7):   # the collectors now key by generation
        asyncio.run(agent.run_batch(_by_generation(T0 + 60 * n, n)))
    assert not [e for e in _events(published) if e[0] in ("opened", "cleared")], _events(published)
    assert {(f.detector, f.where["host"]): f.first_seen for f in handler.open_findings()} == before
    assert agent.home_moved == 3   # stor-c's host partition was the generation's already
    for host, (_, old) in FLEET.items():
        key = f"power-detector|{host}"
        assert [(p, k) for p, k, v in table.log if k == key][-1] == (GEN_PARTITION, key)
        if old != GEN_PARTITION:
            assert [v for p, k, v in table.log if k == key and p == old][-1] is None   # the old copy deleted
    # a restart: the state after the move, or none (the tombstone recovered last), never the one before it
    for order in ([0, 1, 2, 3], [2, 0, 1, 3], [3, 2, 1, 0]):
        recovered = table.recovered(order)
        for host in FLEET:
            key = f"power-detector|{host}"
            assert recovered.get(key) in (None, table[key]), (order, host)
