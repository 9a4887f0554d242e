"""A detector key whose records move to another partition: its state moves with them, in one copy.

The netperf detector's state key is the target set, while its records were keyed by the measuring host
(opsloop.topics.series_key; now by the set, so this takes a key whose records really change partition,
as a partition count change or an older worker's records do): a set measured from another host came
from another partition. The agent
wrote the state to the new partition and left the old copy in the old one for good, so a restart that
recovered the old partition last brought back the state from before the move (a cleared drop open again,
re-published after refresh_s, and the old baseline).
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import REGISTRY

from bench.stream_workload import Msg
from opsloop.records import metric
from opsloop.wire import encode_batch
from opsloop.streams.agents.stateful import AGENT_NAME
from opsloop.streams.detectors.netperf.handler import NetperfHandler
from tests.streams.agents.test_state_partition import T0, ChangelogTable, Event, agent_for

KEY = "netperf-detector|six-vms"
BASE = {1: 3.23, 2: 6.0, 4: 8.02, 8: 8.42}


def measured(host: str, partition: int, offset: int, gbps_by_queues: dict[int, float], ts: float) -> Event:
    """One round of the target set six-vms measured from ``host`` (the record's key: its partition)."""
    samples = [metric("netperf_throughput", {"mean_gbps": g, "min_gbps": g * 0.95, "runs": 10, "failed_targets": 0,
                                             "failed": ""},
                      {"host": host, "target_set": "six-vms", "driver": "netperf", "test": "TCP_STREAM",
                       "queues": str(q), "kernel": "4.4"}, ts)
               for q, g in gbps_by_queues.items()]
    return Event(Msg("telemetry.netperf", partition, offset, host.encode(), encode_batch(samples)))


def drop_open(state: dict[str, Any] | None) -> bool:
    return bool(state) and any(d["detector"] == "netperf.throughput_drop"
                               for d in state["detector"]["book"]["open"].values())


def moved_total() -> float:
    return REGISTRY.get_sample_value("opsloop_stream_state_home_moved_total", {"agent": AGENT_NAME}) or 0.0


def test_a_target_set_measured_from_another_host_moves_its_state_and_a_restart_never_brings_back_the_old() -> None:
    table = ChangelogTable()
    agent = agent_for(NetperfHandler(), table)
    asyncio.run(agent.run_batch([measured("bench-1", 1, 0, BASE, T0)]))
    asyncio.run(agent.run_batch([measured("bench-1", 1, 1, {8: 3.5}, T0 + 3600)]))   # the drop opens
    assert drop_open(table[KEY]) and table.partitions_of(KEY) == {1}
    before = moved_total()
    # bench-2 (partition 0) measures the set now, back at 8.4 Gb/s: the drop clears
    asyncio.run(agent.run_batch([measured("bench-2", 0, 0, {8: 8.4}, T0 + 7200)]))
    assert not drop_open(table[KEY])
    assert [r for r in table.log if r[0] == 1 and r[1] == KEY][-1] == (1, KEY, None)   # was: the open drop
    assert agent.home_moved == 1 and moved_total() == before + 1
    # A restart recovering either partition last: the state after the move, or none (the tombstone
    # recovered after the new copy, until compaction removes it: a re-warm), never the one from before.
    for order in ([1, 0], [0, 1]):
        recovered = table.recovered(order).get(KEY)
        assert recovered is None or recovered == table[KEY], order
        assert not drop_open(recovered)


def test_without_an_event_of_the_old_partition_the_copy_is_deleted_all_the_same_and_counted() -> None:
    table = ChangelogTable()
    asyncio.run(agent_for(NetperfHandler(), table).run_batch([measured("bench-1", 1, 0, BASE, T0)]))
    restarted = table.recovered([0, 1])     # a restarted worker: six-vms recovered from partition 1
    agent = agent_for(NetperfHandler(), restarted)
    before = moved_total()
    asyncio.run(agent.run_batch([measured("bench-2", 0, 0, {8: 8.4}, T0 + 7200)]))   # no event of partition 1
    # was: the copy in partition 1 stayed for good (deleted only under an event of partition 1, which a partition
    # that no longer gets the key's records never has)
    assert restarted.log[-2:] == [(1, KEY, None), (0, KEY, restarted[KEY])]
    assert agent.home_moved == 1 and moved_total() == before + 1
    assert agent._home["netperf-detector"]["six-vms"] == 0
    assert agent._last.keys() == {0}
