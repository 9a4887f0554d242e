"""Detector state after a partition moves to another worker (and comes back), on Faust's real table.

Faust's memory store drops after a recovery only the keys the recovery filled (``_key_partition``);
a key first written live on this worker stayed in memory after its partition went to another worker.
The next restore handed that stale copy to the handlers, and if the partition came back once the
other worker's tombstone for the key had been compacted away, the deleted key lived on here.
The rebalance goes through Faust's own signals and table callbacks, in Faust's order.
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import pytest
from faust.types import TP

from opsloop.streams.agents import stateful
from opsloop.streams.agents.stateful import StatefulAgent, state_table
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from tests.streams.agents.test_state_partition import HV_C, T0, Recovered, agent_for, drift_open, report

CHANGELOG = "agents-rebalance-detector-state-changelog"
SOURCE = "telemetry.iptables"
HV_A = "firewall-detector|hv-a"


@pytest.fixture(autouse=True)
def no_broker_to_confirm(monkeypatch: pytest.MonkeyPatch) -> None:
    """These workers' app never starts its producer (broker 127.0.0.1:1): their state writes are never acknowledged,
    and waiting STATE_CONFIRM_S (60 s) per batch for them tests nothing here; the confirmation is tested against a
    real broker in tests/streams/test_state_write_refused.py."""
    monkeypatch.setattr(stateful, "STATE_CONFIRM_S", 0.0)


def worker() -> tuple[StatefulAgent, faust.Table]:
    app = faust.App("agents-rebalance", broker="kafka://127.0.0.1:1", value_serializer="raw")
    table = state_table(app)
    agent = agent_for(FirewallHandler(), table)
    agent.register()                       # connects the agent to Faust's rebalance signals
    return agent, table


async def rebalance(agent: StatefulAgent, table: faust.Table, was: set[int], now: set[int],
                    replay: list[Recovered]) -> None:
    """One eager rebalance as Faust runs it: every partition revoked, the new assignment, the recovery
    of the table partitions (``replay``: the changelog records read), the memory store's drop."""
    app = agent.app
    await app.on_partitions_revoked.send({TP(SOURCE, p) for p in was})
    await app.on_partitions_assigned.send({TP(SOURCE, p) for p in now} | {TP(CHANGELOG, p) for p in now})
    table.apply_changelog_batch(replay)
    await table.on_recovery_completed({TP(CHANGELOG, p) for p in now}, set())


def test_a_key_written_here_leaves_memory_with_its_partition_and_stays_gone_when_it_comes_back() -> None:
    async def run() -> None:
        agent, table = worker()
        # this worker holds both partitions: hv-c (partition 1) drifts from hv-a and hv-b (partition 0)
        await agent.run_batch([report("hv-c", T0, 1, 0, "base-b"), report("hv-a", T0, 0, 0, "base-a"),
                               report("hv-b", T0, 0, 1, "base-a")])
        assert drift_open(table[HV_C])
        # partition 1 goes to another worker (a live-written key: not in Faust's recovery map before)
        await rebalance(agent, table, {0, 1}, {0}, [])
        assert HV_C not in table                                  # was: still in memory
        await agent.run_batch([report("hv-a", T0 + 60, 0, 2, "base-a"), report("hv-b", T0 + 60, 0, 3, "base-a")])
        handler = agent.handlers[0]
        assert handler.state_of("hv-c") is None                   # was: restored, the stale report kept
        assert HV_C not in table and agent.home_unknown == 0
        assert not [f for f in handler.open_findings() if "hv-c" in str(f)]
        # The other worker deleted hv-c and its tombstone was compacted away: partition 1 comes back
        # with a changelog holding no record of hv-c (another key only).
        await rebalance(agent, table, {0}, {0, 1}, [Recovered("firewall-detector|hv-x", {"book": {}}, 1)])
        assert HV_C not in table                                  # was: the deleted key back from memory
        assert "firewall-detector|hv-x" in table and HV_A in table

    asyncio.run(run())


def test_a_newer_copy_written_by_the_other_worker_wins_when_the_partition_comes_back() -> None:
    async def run() -> None:
        agent, table = worker()
        await agent.run_batch([report("hv-c", T0, 1, 0, "base-b"), report("hv-a", T0, 0, 0, "base-a"),
                               report("hv-b", T0, 0, 1, "base-a")])
        await rebalance(agent, table, {0, 1}, {0}, [])
        newer: dict[str, Any] = {"report": None, "book": {"open": {}, "published": {}}, "by": "the other worker"}
        await rebalance(agent, table, {0}, {0, 1}, [Recovered(HV_C, newer, 1)])
        assert table[HV_C] == newer
        await agent.run_batch([report("hv-a", T0 + 60, 0, 2, "base-a")])   # restore reads the table
        assert agent._home["firewall-detector"]["hv-c"] == 1

    asyncio.run(run())


def test_kept_partitions_keep_their_keys_and_standby_copies_are_not_restored() -> None:
    async def run() -> None:
        agent, table = worker()
        await agent.run_batch([report("hv-c", T0, 1, 0, "base-a"), report("hv-a", T0, 0, 0, "base-a")])
        await rebalance(agent, table, {0, 1}, {0, 1}, [])          # a rebalance that moves nothing
        assert HV_C in table and HV_A in table
        await rebalance(agent, table, {0, 1}, {0}, [])
        # Faust applies the changelog of a standby partition to the same memory store, after the recovery
        table.apply_changelog_batch([Recovered("firewall-detector|hv-s", {"book": {}}, 1)])
        await agent.run_batch([report("hv-a", T0 + 60, 0, 1, "base-a")])
        assert agent.handlers[0].state_of("hv-s") is None          # another worker's key: not ours to run
        assert set(agent._home["firewall-detector"]) == {"hv-a"}

    asyncio.run(run())


def test_a_key_that_moved_partition_is_kept_with_the_partition_it_lives_in_now() -> None:
    async def run() -> None:
        agent, table = worker()
        # recovered from partition 1, then its records come from partition 0 (its record key changed)
        table.apply_changelog_batch([Recovered(HV_A, {"book": {"open": {}, "published": {}}}, 1)])
        await table.on_recovery_completed({TP(CHANGELOG, 0), TP(CHANGELOG, 1)}, set())
        await agent.run_batch([report("hv-a", T0, 0, 0, "base-a")])
        await rebalance(agent, table, {0, 1}, {0}, [])
        assert HV_A in table                                       # Faust's map said 1: dropped by its recovery
        assert table.data._key_partition[HV_A] == 0

    asyncio.run(run())


def test_a_key_written_elsewhere_for_want_of_its_homes_event_stays_while_its_home_is_ours() -> None:
    async def run() -> None:
        agent, table = worker()
        await agent.run_batch([report("hv-c", T0, 1, 0, "base-b")])            # hv-c's home: partition 1
        hv_c = dict(table[HV_C])
        await rebalance(agent, table, {0, 1}, {0}, [])
        await rebalance(agent, table, {0}, {0, 1}, [Recovered(HV_C, hv_c, 1)])   # back: no event of it yet
        await agent.run_batch([report("hv-a", T0 + 5, 0, 0, "base-a"), report("hv-b", T0 + 5, 0, 1, "base-a")])
        assert drift_open(table[HV_C]) and agent.home_unknown == 1              # written under partition 0's event
        await rebalance(agent, table, {0, 1}, {1}, [])                          # partition 0 goes, hv-c's home stays
        assert drift_open(table[HV_C])                                          # was: dropped by Faust's recovery

    asyncio.run(run())
