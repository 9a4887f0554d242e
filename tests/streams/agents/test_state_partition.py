"""Detector state is written to its key's own changelog partition, whichever partition's records changed it.

Faust writes a table key to the partition of the current event. The firewall's drift check (one role,
all its hypervisors) changes findings about hypervisors whose records come from other partitions; the
agent wrote such a key under the event of the batch group that touched it, so one hypervisor's state
lived in two changelog partitions and a restart recovered whichever came last, possibly the older copy.
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import orjson
from faust.streams import current_event
from prometheus_client import REGISTRY

from bench.stream_workload import Msg
from opsloop.records import metric
from opsloop.wire import encode_batch
from opsloop.streams.agents.stateful import AGENT_NAME, StatefulAgent, state_table
from opsloop.streams.detectors.firewall.detector import FINGERPRINT_DRIFT
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.firewall.settings import FirewallSettings
from opsloop.streams.detectors.power.handler import PowerHandler
from tests.streams.agents.test_handlers import power_samples
from tests.streams.agents.test_runtime import loop_for

T0 = 1_790_000_000.0
HV_C = "firewall-detector|hv-c"


class Event:
    def __init__(self, msg: Msg) -> None:
        self.message = msg


class ChangelogTable(dict):
    """A table whose every write and delete is appended to a per-partition changelog, as Faust's is:
    to the partition of the current event."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[int, str, Any]] = []   # (partition, key, value or None: tombstone)
        self._key_partition: dict[str, int] = {}    # filled by a recovery only, as Faust's memory store

    def __setitem__(self, key: str, value: Any) -> None:
        value = orjson.loads(orjson.dumps(value))   # JSON, as the changelog stores it
        self.log.append((current_event().message.partition, key, value))
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.log.append((current_event().message.partition, key, None))
        super().__delitem__(key)

    def tombstone(self, key: str, partition: int, stamp_ms: int | None = None) -> None:
        """The real table's delete of a key's copy in another partition than the current event's."""
        self.log.append((partition, key, None))

    @property
    def data(self) -> Any:
        """Faust's memory store's map of recovered keys to their partition (``_key_partition``)."""
        return self

    def partitions_of(self, key: str) -> set[int]:
        return {p for p, k, _ in self.log if k == key}

    def recovered(self, order: list[int]) -> ChangelogTable:
        """The table a restarted worker holding every partition rebuilds, recovering ``order`` in turn."""
        out = ChangelogTable()
        for p in order:
            for q, k, v in self.log:
                if q != p:
                    continue
                out.log.append((q, k, v))
                out._key_partition[k] = q
                if v is None:
                    dict.pop(out, k, None)
                else:
                    dict.__setitem__(out, k, v)
        return out


def agent_for(handler: FirewallHandler | PowerHandler, table: Any) -> StatefulAgent:
    return loop_for(handler, table, [])   # the agent of the runtime tests (findings sent nowhere we read)


def report(hv: str, ts: float, partition: int, offset: int, base_fp: str) -> Event:
    """One complete firewall round of ``hv`` (one protected port), keyed by the hypervisor."""
    samples = [metric("iptables_vm_port", {"protected": 1}, {"host": hv, "port_id": "p1", "device": "tapp1",
                                                              "vm": "vm-p1"}, ts),
               metric("iptables_ruleset", {"fingerprint": f"fp-{hv}", "base_fingerprint": base_fp,
                                           "ports_expected": 1}, {"host": hv}, ts),
               metric("iptables_software", {"version": "2:9.4.1"}, {"host": hv, "package": "neutron-common"}, ts)]
    return Event(Msg("telemetry.iptables", partition, offset, hv.encode(), encode_batch(samples)))


def drift_open(state: dict[str, Any] | None) -> bool:
    return bool(state) and any(d["detector"] == FINGERPRINT_DRIFT for d in state["book"]["open"].values())


HOMES = {"firewall-detector|hv-a": 0, "firewall-detector|hv-b": 0, HV_C: 1, "firewall-detector|hv-x": 1}


def assert_every_key_at_home(table: ChangelogTable) -> None:
    for key in {k for _, k, _ in table.log}:
        assert table.partitions_of(key) == {HOMES[key]}, (key, table.log)


def test_drift_found_by_another_partitions_records_is_written_to_the_hypervisors_own_partition() -> None:
    table = ChangelogTable()
    agent = agent_for(FirewallHandler(), table)
    # hv-c (partition 1) reports alone: a role of one, nothing to compare
    asyncio.run(agent.run_batch([report("hv-c", T0, 1, 0, "base-b")]))
    # hv-a and hv-b (partition 0) complete the role: hv-c's ruleset now differs from the majority
    asyncio.run(agent.run_batch([report("hv-a", T0 + 5, 0, 0, "base-a"), report("hv-b", T0 + 5, 0, 1, "base-a")]))
    assert drift_open(table[HV_C])                        # the scenario: hv-c changed by partition 0's batch
    assert_every_key_at_home(table)                       # was: hv-c's drift written to partition 0
    assert agent.home_unknown == 0
    # hv-c fixes its ruleset: the drift clears, on its own partition as before
    asyncio.run(agent.run_batch([report("hv-c", T0 + 60, 1, 1, "base-a")]))
    assert not drift_open(table[HV_C])
    assert_every_key_at_home(table)
    # A restarted worker rebuilds the same table whatever order it recovers the partitions in
    # (was: partition 0 recovered last brought back hv-c's drift, cleared since).
    assert dict(table.recovered([1, 0])) == dict(table) == dict(table.recovered([0, 1]))


def test_a_power_deviation_found_by_another_partitions_hosts_is_written_to_the_hosts_own_partition() -> None:
    def power(host: str, watts: float, partition: int, offset: int) -> Event:
        return Event(Msg("telemetry.ipmi", partition, offset, host.encode(),
                         encode_batch(power_samples(host, "gen2x", watts, 48, T0, 4))))

    table = ChangelogTable()
    agent = agent_for(PowerHandler(), table)
    asyncio.run(agent.run_batch([power("hot", 290.0, 1, 0)]))           # alone in its generation
    asyncio.run(agent.run_batch([power(f"ok-{i}", 205.0 + i, 0, i) for i in range(3)]))
    assert "power.generation_deviation" in {d["detector"] for d in table["power-detector|hot"]["book"]["open"].values()}
    homes = {f"power-detector|ok-{i}": 0 for i in range(3)} | {"power-detector|hot": 1}
    assert {k: table.partitions_of(k) for k in homes} == {k: {p} for k, p in homes.items()}


def test_a_key_fed_later_in_the_same_batch_is_written_home() -> None:
    table = ChangelogTable()
    agent = agent_for(FirewallHandler(), table)
    # partition 1's group comes first (its record is first), then partition 0's changes hv-c again
    asyncio.run(agent.run_batch([report("hv-c", T0, 1, 0, "base-b"), report("hv-a", T0, 0, 0, "base-a"),
                                 report("hv-b", T0, 0, 1, "base-a")]))
    assert drift_open(table[HV_C])
    assert_every_key_at_home(table)


def test_a_dropped_key_is_deleted_from_its_own_partition_and_its_home_forgotten() -> None:
    table = ChangelogTable()
    handler = FirewallHandler()
    handler.bound_state(max_clock_skew_s=300.0, state_ttl_s=3600.0, max_state_keys=2)
    agent = agent_for(handler, table)
    asyncio.run(agent.run_batch([report("hv-c", T0, 1, 0, "base-a")]))
    # two more hypervisors on partition 0: over the cap of 2, hv-c (least recently seen) is dropped
    asyncio.run(agent.run_batch([report("hv-a", T0, 0, 0, "base-a"), report("hv-b", T0, 0, 1, "base-a")]))
    assert HV_C not in table and table.log[-1] != (0, HV_C, None)
    assert (1, HV_C, None) in table.log                   # the tombstone where hv-c's state lives
    assert_every_key_at_home(table)
    assert "hv-c" not in agent._home[handler.name]        # bounded with the handler's state
    assert HV_C not in table.recovered([0, 1]) and HV_C not in table.recovered([1, 0])


def home_unknown_total() -> float:
    return REGISTRY.get_sample_value("opsloop_stream_state_home_unknown_total", {"agent": AGENT_NAME}) or 0.0


def test_a_partition_kept_through_a_rebalance_keeps_its_latest_event() -> None:
    table = ChangelogTable()
    agent = agent_for(FirewallHandler(), table)
    asyncio.run(agent.run_batch([report("hv-c", T0, 1, 0, "base-b")]))
    agent.revoke({0, 1})                                  # Kafka's eager rebalance revokes everything first
    agent.assign({0, 1})                                  # and gives both back
    # partition 0's records find hv-c's drift before partition 1's first batch since the rebalance
    asyncio.run(agent.run_batch([report("hv-a", T0 + 5, 0, 0, "base-a"), report("hv-b", T0 + 5, 0, 1, "base-a")]))
    assert drift_open(table[HV_C])
    assert_every_key_at_home(table)                       # was: hv-c's drift written to partition 0, counted
    assert agent.home_unknown == 0
    agent.revoke({0, 1})
    agent.assign({0})
    assert set(agent._last) == {0}                        # a partition that left: never written to again


def test_a_key_whose_home_partition_has_no_event_yet_falls_back_counted() -> None:
    table = ChangelogTable()
    asyncio.run(agent_for(FirewallHandler(), table).run_batch([report("hv-c", T0, 1, 0, "base-b")]))
    restarted = table.recovered([0, 1])
    agent = agent_for(FirewallHandler(), restarted)
    # hv-c's home is known (recovered from partition 1) but no event of partition 1 came yet: its drift,
    # found by partition 0's records, is written where it was touched, and counted
    before = home_unknown_total()
    asyncio.run(agent.run_batch([report("hv-a", T0 + 5, 0, 0, "base-a"), report("hv-b", T0 + 5, 0, 1, "base-a")]))
    assert drift_open(restarted[HV_C]) and restarted.partitions_of(HV_C) == {0, 1}
    assert agent.home_unknown == 1 and home_unknown_total() == before + 1
    assert set(agent._last) == {0}
    # partition 1 goes to another worker: hv-c leaves this worker's memory (no tombstone: not ours)
    written = len(restarted.log)
    agent.assign({0})
    assert HV_C not in restarted and "hv-c" not in agent._home["firewall-detector"]
    assert len(restarted.log) == written


def test_a_restarted_worker_writes_a_silent_key_to_the_partition_it_recovered_it_from() -> None:
    table = ChangelogTable()
    asyncio.run(agent_for(FirewallHandler(), table).run_batch([report("hv-c", T0, 1, 0, "base-b")]))
    # Restarted: hv-c stays silent; hv-x (another role) is partition 1's only record, and partition 0's
    # hv-a and hv-b complete hv-c's role, so hv-c's drift is found by partition 0's records.
    restarted = table.recovered([0, 1])
    agent = agent_for(FirewallHandler(FirewallSettings(roles={"hv-x": "storage"})), restarted)
    asyncio.run(agent.run_batch([report("hv-x", T0 + 5, 1, 1, "base-a"), report("hv-a", T0 + 5, 0, 0, "base-a"),
                                 report("hv-b", T0 + 5, 0, 1, "base-a")]))
    assert drift_open(restarted[HV_C])
    assert_every_key_at_home(restarted)                   # without the recovered home: partition 0, counted
    assert agent.home_unknown == 0


class Recovered:
    """A changelog record as Faust's recovery hands it to the table (key and value deserialised)."""

    def __init__(self, key: str, value: Any, partition: int) -> None:
        self.key, self.value = key, value
        self.message = Msg("opsloop-detector-state-changelog", partition, 0, key.encode(),
                           orjson.dumps(value) if value is not None else None)  # type: ignore[arg-type]


def test_faust_tells_the_partition_a_key_was_recovered_from() -> None:
    """The map the agent reads is Faust's (memory store, faust-streaming 0.15): an upgrade that drops it
    fails here rather than silently losing the homes of silent keys."""
    app = faust.App("agents-partition-faust", broker="kafka://127.0.0.1:1", value_serializer="raw")
    table = state_table(app)
    table.apply_changelog_batch([Recovered(HV_C, {"book": {}}, 1), Recovered("firewall-detector|hv-a", {}, 0),
                                 Recovered("firewall-detector|hv-a", {}, 2)])   # the last record wins
    agent = agent_for(FirewallHandler(), table)
    assert dict(agent.recovered_partitions()) == {HV_C: 1, "firewall-detector|hv-a": 2}
