"""The worker's gauges after a partition moves to another worker.

``opsloop_finding_active`` is exported by every worker for the findings it holds. A restore after a
rebalance only added the findings restored: those of a partition that left stayed at 1 here for good,
beside the new owner's series (which goes to 0 when it clears), so an alert on the gauge never resolved.
"""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from opsloop.streams.detectors.firewall.detector import FINGERPRINT_DRIFT
from tests.streams.agents.test_state_partition import T0, report
from tests.streams.agents.test_state_rebalance import no_broker_to_confirm, rebalance, worker  # noqa: F401 (autouse)


def test_the_findings_of_a_partition_that_left_leave_the_gauges() -> None:
    async def run() -> None:
        agent, table = worker()
        # hv-c (partition 1) drifts from hv-a and hv-b (partition 0)
        await agent.run_batch([report("hv-c", T0, 1, 0, "base-b"), report("hv-a", T0, 0, 0, "base-a"),
                               report("hv-b", T0, 0, 1, "base-a")])
        [drift] = [f for f in agent.handlers[0].open_findings() if f.detector == FINGERPRINT_DRIFT]
        assert drift.where["hypervisor"] == "hv-c"
        entry = agent.sink.active.get(drift.id)
        assert entry is not None and entry.active
        await rebalance(agent, table, {0, 1}, {0}, [])   # partition 1 goes to another worker
        await agent.run_batch([report("hv-a", T0 + 60, 0, 2, "base-a"), report("hv-b", T0 + 60, 0, 3, "base-a")])
        assert agent.sink.active.get(drift.id) is None   # was: active here for good
        # the findings this worker still holds stay shown
        assert all(agent.sink.active.get(f.id) is not None for f in agent.handlers[0].open_findings())
        # and a partition kept through a rebalance keeps its findings shown
        await rebalance(agent, table, {0}, {0, 1}, [])
        await agent.run_batch([report("hv-c", T0 + 120, 1, 1, "base-b")])
        [again] = [f for f in agent.handlers[0].open_findings() if f.detector == FINGERPRINT_DRIFT]
        entry = agent.sink.active.get(again.id)
        assert entry is not None and entry.active

    asyncio.run(run())


def test_the_gauges_of_keys_that_left_are_dropped_at_the_restore() -> None:
    """Before: a restore replaced the handler's state but left the gauge children of the keys it no longer
    holds: this worker showed hv-c's ports and report time frozen at their last values for good."""
    async def run() -> None:
        agent, table = worker()
        await agent.run_batch([report("hv-c", T0, 1, 0, "base-b"), report("hv-a", T0, 0, 0, "base-a")])
        assert REGISTRY.get_sample_value("opsloop_firewall_report_timestamp_seconds", {"hypervisor": "hv-c"}) == T0
        await rebalance(agent, table, {0, 1}, {0}, [])   # partition 1 goes to another worker
        await agent.run_batch([report("hv-a", T0 + 60, 0, 2, "base-a")])
        assert REGISTRY.get_sample_value("opsloop_firewall_report_timestamp_seconds", {"hypervisor": "hv-c"}) is None
        assert REGISTRY.get_sample_value("opsloop_firewall_report_timestamp_seconds",
                                         {"hypervisor": "hv-a"}) == T0 + 60

    asyncio.run(run())
