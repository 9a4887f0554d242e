"""A detector state key held in several changelog partitions: the copy written last wins, whatever the recovery's order.

A key whose records moved partition (ipmi readings keyed by generation, a netperf target set measured from another
host, partitions added) was written to its new partition; its old copy was deleted only under an event of the old
partition, which one that gets no more records never has: both copies stayed for good. Faust recovers every
changelog partition into one dict, so the copy recovered last won: after a restart the state from before the move
(an old baseline, cleared findings open again) or the old copy's tombstone deleting the new one. Deployments from
before the fix hold such pairs already. Here on Faust's real table (``apply_changelog_batch``, its memory store):
each record carries its Kafka timestamp, as the recovery hands it over. The real worker and broker:
``test_state_moved_live.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import orjson
from faust.types import TP
from faust.types.tuples import ConsumerMessage

from opsloop.streams.agents.stateful import state_table
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from tests.streams.agents.test_state_partition import HV_C, T0, ChangelogTable, agent_for, drift_open, report
from tests.streams.agents.test_state_rebalance import no_broker_to_confirm  # noqa: F401 (autouse)

CHANGELOG = "agents-newest-detector-state-changelog"
MS = 1_790_000_000_000   # a record time, in ms


class Record:
    """A changelog record as Faust's recovery hands it to the table: key and value decoded, and the message with its
    partition, offset and Kafka timestamp (seconds, CreateTime)."""

    def __init__(self, key: str, value: Any, partition: int, offset: int, ms: int) -> None:
        self.key, self.value = key, value
        self.message = ConsumerMessage(CHANGELOG, partition, offset, ms / 1000.0, 0, [], orjson.dumps(key),
                                       None if value is None else orjson.dumps(value), None)


def table_for(name: str) -> Any:
    return state_table(faust.App(name, broker="kafka://127.0.0.1:1", value_serializer="raw"))


def recovered(records: list[Record], order: list[int], name: str = "agents-newest") -> Any:
    """A fresh table recovering ``records`` a partition at a time, in ``order`` (as Faust may)."""
    table = table_for(name)
    for p in order:
        table.apply_changelog_batch([r for r in records if r.message.partition == p])
    return table


OLD, NEW = {"by": "before the move"}, {"by": "after the move"}


def test_of_two_copies_of_a_key_the_newer_is_kept_in_either_order_and_the_older_named() -> None:
    # the incident: 144 records in partition 2 (the last the day before, no tombstone), 65 in partition 3
    records = [Record(HV_C, {"n": i}, 2, i, MS + i) for i in range(143)] + [Record(HV_C, OLD, 2, 143, MS + 143)]
    records += [Record(HV_C, NEW, 3, i, MS + 86_400_000 + i) for i in range(65)]
    newest = MS + 86_400_000 + 64
    for order in ([2, 3], [3, 2]):
        table = recovered(records, order)
        assert table[HV_C] == NEW, order                          # was: OLD when partition 2 came last
        assert table.data._key_partition[HV_C] == 3, order        # where it lives: the restore's home
        assert table.stale_copies() == {HV_C: (3, newest, {2})}, order
        assert table.stale_copies() == {}                         # handed over once
    # interleaved, as the recovery's buffer mixes partitions
    table = table_for("agents-newest-mixed")
    table.apply_changelog_batch([records[-1], records[0], records[-2], records[143]])
    assert table[HV_C] == NEW


def test_the_delete_of_an_old_copy_never_deletes_the_new_one() -> None:
    # the move: the old copy's tombstone stamped before (or in the same ms as) the new copy's write
    for gap in (0, 5):
        records = [Record(HV_C, OLD, 1, 0, MS), Record(HV_C, None, 1, 1, MS + 1000),
                   Record(HV_C, NEW, 0, 0, MS + 1000 + gap)]
        for order in ([1, 0], [0, 1]):
            table = recovered(records, order)
            assert table.get(HV_C) == NEW, (gap, order)           # was: none when partition 1 came last
            assert table.stale_copies() == {}, (gap, order)       # nothing left to delete


def test_a_key_deleted_after_its_move_stays_deleted_in_either_order() -> None:
    records = [Record(HV_C, OLD, 1, 0, MS), Record(HV_C, NEW, 0, 0, MS + 1000), Record(HV_C, None, 0, 1, MS + 2000)]
    for order in ([0, 1], [1, 0]):
        table = recovered(records, order)
        assert HV_C not in table, order                           # was: OLD back when partition 1 came last
        # the older copy still lives in partition 1: named, to delete before the tombstone is compacted away
        assert table.stale_copies() == {HV_C: (0, MS + 2000, {1})}, order


def test_records_of_one_partition_apply_in_offset_order_whatever_their_times() -> None:
    # two workers owning the partition in turn, the second's clock behind: the later record still wins
    table = recovered([Record(HV_C, OLD, 1, 0, MS + 5000), Record(HV_C, NEW, 1, 1, MS)], [1])
    assert table[HV_C] == NEW
    table.apply_changelog_batch([Record(HV_C, None, 1, 2, MS - 10)])
    assert HV_C not in table


def test_records_without_a_time_apply_as_faust_applies_them() -> None:
    plain = [Record(HV_C, OLD, 1, 0, MS), Record(HV_C, NEW, 0, 0, MS + 1000)]
    for r in plain:
        r.message.timestamp = None  # type: ignore[attr-defined]
    assert recovered(plain, [0, 1])[HV_C] == OLD and recovered(plain, [1, 0])[HV_C] == NEW


def tombstones_sent(table: Any) -> list[dict[str, Any]]:
    """The deletes the table sends to its changelog topic (into the producer's buffer: no broker here)."""
    sent: list[dict[str, Any]] = []
    real = table.changelog_topic.send_soon

    def send_soon(**kwargs: Any) -> Any:
        if kwargs["value"] is None:
            sent.append(kwargs)
        return real(**kwargs)
    table.changelog_topic.send_soon = send_soon  # type: ignore[method-assign]
    return sent


def firewall_states() -> tuple[dict[str, Any], dict[str, Any]]:
    """hv-c's state with its ruleset drift open, and after it cleared (the detector's own states)."""
    log = ChangelogTable()
    agent = agent_for(FirewallHandler(), log)
    asyncio.run(agent.run_batch([report("hv-c", T0, 1, 0, "base-b"), report("hv-a", T0, 0, 0, "base-a"),
                                 report("hv-b", T0, 0, 1, "base-a")]))
    drifted = dict(log[HV_C])
    asyncio.run(agent.run_batch([report("hv-c", T0 + 60, 1, 1, "base-a")]))
    assert drift_open(drifted) and not drift_open(log[HV_C])
    return drifted, dict(log[HV_C])


def test_a_restart_restores_the_newer_copy_and_deletes_the_older_at_the_newer_ones_time() -> None:
    drifted, cleared = firewall_states()
    # a deployment from before the fix: hv-c's drift (partition 1), then, moved, its clear (partition 0)
    records = [Record(HV_C, drifted, 1, 0, MS), Record(HV_C, cleared, 0, 0, MS + 60_000)]
    for order in ([0, 1], [1, 0]):
        table = recovered(records, order, f"agents-newest-restart-{order[0]}")
        sent = tombstones_sent(table)
        asyncio.run(table.on_recovery_completed({TP(CHANGELOG, 0), TP(CHANGELOG, 1)}, set()))
        agent = agent_for(FirewallHandler(), table)
        agent.assign({0, 1})
        asyncio.run(agent.run_batch([report("hv-a", T0 + 120, 0, 2, "base-a")]))
        handler = agent.handlers[0]
        assert not [f for f in handler.open_findings() if "hv-c" in str(f)], order   # was: the drift re-opened
        assert agent._home["firewall-detector"]["hv-c"] == 0
        # the older copy deleted, stamped as the newer (a value wins the tie): a later recovery keeps the newer
        assert [(s["key"], s["partition"], s["value"], round(s["timestamp"] * 1000)) for s in sent] == \
            [(HV_C, 1, None, MS + 60_000)], order
        again = recovered([*records, Record(HV_C, None, 1, 1, MS + 60_000)], [0, 1]).get(HV_C)
        assert again == cleared == recovered([*records, Record(HV_C, None, 1, 1, MS + 60_000)], [1, 0]).get(HV_C)


def test_a_worker_deletes_no_older_copy_of_a_key_whose_newest_copy_is_another_workers() -> None:
    records = [Record(HV_C, OLD, 1, 0, MS), Record(HV_C, NEW, 0, 0, MS + 1000)]
    table = recovered(records, [1, 0])
    sent = tombstones_sent(table)
    agent = agent_for(FirewallHandler(), table)
    agent.assign({1})                                            # partition 0, hv-c's newest copy, is not ours
    asyncio.run(agent.run_batch([report("hv-x", T0, 1, 0, "base-a")]))
    assert sent == []


def test_this_workers_delete_of_an_old_copy_applied_back_as_a_standby_record_keeps_the_key() -> None:
    async def run() -> None:
        table = table_for("agents-newest-standby")
        sent = tombstones_sent(table)
        table.apply_changelog_batch([Record(HV_C, OLD, 1, 0, MS)])
        agent = agent_for(FirewallHandler(), table)
        # hv-c's records now come from partition 0: moved, the copy in partition 1 deleted with no event of it
        await agent.run_batch([report("hv-c", T0, 0, 0, "base-a")])
        assert [(s["key"], s["partition"], s["value"]) for s in sent] == [(HV_C, 1, None)]
        # partition 1 is another worker's now, this worker its standby: its own tombstone comes back
        written = table[HV_C]
        table.apply_changelog_batch([Record(HV_C, None, 1, 1, round(sent[0]["timestamp"] * 1000))])
        assert table[HV_C] == written                              # without the stamp of its own write: deleted

    asyncio.run(run())
