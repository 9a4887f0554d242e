"""A worker's own view of its assignment: the partitions it holds and the rebalances it went through.

Driven through the Faust app's own rebalance signals (the ones Faust's consumer sends), in the order
Kafka's eager protocol uses: every partition revoked, then the whole new assignment. With two workers
on a real broker: tests/scale/test_scale_out.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from faust.types import TP
from prometheus_client import REGISTRY

from opsloop.config import load_settings
from opsloop.streams.runtime.app import create_app


def held(topic: str) -> set[int]:
    return {int(s.labels["partition"]) for fam in REGISTRY.collect() if fam.name == "opsloop_stream_partition_assigned"
            for s in fam.samples if s.labels["topic"] == topic and s.value == 1}


def rebalances() -> float:
    return REGISTRY.get_sample_value("opsloop_stream_rebalances_total") or 0.0


def test_the_gauge_follows_each_new_assignment_and_the_counter_counts_them(tmp_path: Path) -> None:
    settings = load_settings(None, {"stream": {"data_dir": str(tmp_path / "streams")}})
    app = create_app(settings, app_id="t-assignment")
    topic = "t-assignment-topic"
    start = rebalances()

    async def rebalance(old: set[int], new: set[int]) -> tuple[set[int], set[int]]:
        await app.on_partitions_revoked.send({TP(topic, p) for p in old})
        between = held(topic)
        await app.on_partitions_assigned.send({TP(topic, p) for p in new})
        return between, held(topic)

    assert asyncio.run(rebalance(set(), {0, 1, 2, 3})) == (set(), {0, 1, 2, 3})
    # a second worker joined: two partitions moved away; between revocation and assignment, none is held
    assert asyncio.run(rebalance({0, 1, 2, 3}, {1, 3})) == (set(), {1, 3})
    # it left again; this worker takes everything back
    assert asyncio.run(rebalance({1, 3}, {0, 1, 2, 3})) == (set(), {0, 1, 2, 3})
    # more workers than partitions: an empty assignment is one too
    assert asyncio.run(rebalance({0, 1, 2, 3}, set())) == (set(), set())
    assert rebalances() - start == 4
