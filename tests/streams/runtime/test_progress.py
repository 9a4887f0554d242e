"""Partition progress (streams/runtime/progress.py) over a fake consumer: what each held source partition exports.

No broker: the assignment, Faust's committed offsets, the highwaters and the broker's answer are the test's. The
real worker against a real broker: tests/streams/test_partition_progress.py.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import pytest
from faust.types import TP
from prometheus_client import REGISTRY

from opsloop.config import ConfigError, load_settings
from opsloop.log import Sampled
from opsloop.streams.runtime import health, progress
from opsloop.streams.runtime.progress import PartitionProgress, _ProgressService
from opsloop.streams.worker import build_app
from tests.helpers import captured_logs, unique


class FakeConsumer:
    def __init__(self) -> None:
        self.tps: set[TP] = set()
        self.highwaters: dict[TP, int | None] = {}
        self._committed_offset: defaultdict[TP, int | None] = defaultdict(lambda: None)
        self.fail: Exception | None = None   # raised by the next assignment() (then cleared)

    def assignment(self) -> set[TP]:
        if self.fail is not None:
            e, self.fail = self.fail, None
            raise e
        return set(self.tps)

    def highwater(self, tp: TP) -> int | None:
        if tp not in self.tps:
            raise RuntimeError(f"{tp} is not assigned")   # as aiokafka's IllegalStateError
        return self.highwaters.get(tp)


class Rig:
    """Two source topics (two agents), a changelog and Faust's leader topic assigned as well."""

    def __init__(self) -> None:
        self.a, self.b = unique("telemetry.pa"), unique("telemetry.pb")
        self.changelog, self.leader = unique("app-state-changelog"), unique("app-__assignor-__leader")
        self.consumer = FakeConsumer()
        self.asked: list[list[TP]] = []
        self.broker: dict[TP, int] = {}
        self.broker_error: Exception | None = None
        agents = {"x": SimpleNamespace(channel=SimpleNamespace(topics=(self.a,))),
                  "y": SimpleNamespace(channel=SimpleNamespace(topics=(self.b,)))}
        self.group = unique("app")
        self.app = SimpleNamespace(agents=agents, consumer=self.consumer, conf=SimpleNamespace(id=self.group))
        self.progress = PartitionProgress(self.app, timeout_s=1.0, broker_offsets=self.broker_offsets)

    async def broker_offsets(self, tps: Sequence[TP]) -> Mapping[TP, int]:
        self.asked.append(list(tps))
        if self.broker_error is not None:
            raise self.broker_error
        return {tp: self.broker[tp] for tp in tps if tp in self.broker}

    def tick(self) -> None:
        asyncio.run(self.progress.safe_tick())


def value(name: str, tp: TP) -> float | None:
    """The sample of ``tp`` (whatever its group: each rig's topics are its own)."""
    for family in REGISTRY.collect():
        for s in family.samples:
            if s.name == name and (s.labels.get("topic"), s.labels.get("partition")) == (tp.topic, str(tp.partition)):
                return s.value
    return None


def committed(tp: TP) -> float | None:
    return value("opsloop_stream_committed_offset", tp)


def uncommitted(tp: TP) -> float | None:
    return value("opsloop_stream_uncommitted_records", tp)


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "FAILED_LOG", Sampled(60.0))   # not left out after another test's line


def test_every_held_source_partition_exports_its_committed_offset_and_uncommitted_records() -> None:
    rig = Rig()
    a0, a1, b0 = TP(rig.a, 0), TP(rig.a, 1), TP(rig.b, 0)
    changelog, leader = TP(rig.changelog, 0), TP(rig.leader, 0)
    rig.consumer.tps = {a0, a1, b0, changelog, leader}
    rig.consumer.highwaters = {a0: 120, a1: 7, b0: 40, changelog: 9, leader: 1}
    rig.consumer._committed_offset[a0] = 100          # Faust committed it (or found it at the seek)
    rig.broker = {a1: 7}                              # Faust knows none: the broker's commit
    # b0: no commit anywhere: its log start, from the same batched look
    rig.broker[b0] = 30
    rig.tick()
    assert (committed(a0), uncommitted(a0)) == (100, 20)
    assert (committed(a1), uncommitted(a1)) == (7, 0)
    assert (committed(b0), uncommitted(b0)) == (30, 10)
    assert committed(changelog) is None and committed(leader) is None   # Faust's own, not sources
    assert rig.asked == [sorted([a1, b0])]                              # one look, only what Faust does not know
    rig.consumer._committed_offset[a0] = 120                            # the agent caught up, Faust committed
    rig.tick()
    assert (committed(a0), uncommitted(a0)) == (120, 0)


def test_a_revoked_partition_loses_its_series_and_its_batch_lag() -> None:
    rig = Rig()
    a0, a1 = TP(rig.a, 0), TP(rig.a, 1)
    rig.consumer.tps = {a0, a1}
    rig.consumer.highwaters = {a0: 10, a1: 10}
    rig.consumer._committed_offset.update({a0: 5, a1: 6})
    rig.progress.on_assigned({a0, a1})
    health.LAG.labels(rig.a, "0").set(4)   # as process_batch leaves it
    health.LAG.labels(rig.a, "1").set(3)
    rig.tick()
    assert committed(a0) == 5 and committed(a1) == 6
    # Faust's revocation signal: gone at once, though aiokafka still lists it until the rejoin
    rig.progress.on_revoked({a0})
    assert committed(a0) is None and uncommitted(a0) is None and value("opsloop_stream_consumer_lag", a0) is None
    rig.tick()
    assert committed(a0) is None and committed(a1) == 6
    # lost without a signal seen (a consumer restarted): the next tick drops it, the batch lag too
    rig.progress.held = None
    rig.consumer.tps = set()
    rig.tick()
    assert committed(a1) is None and uncommitted(a1) is None and value("opsloop_stream_consumer_lag", a1) is None


def test_a_partition_without_a_highwater_or_a_commit_is_skipped() -> None:
    rig = Rig()
    fetched, unfetched, uncounted = TP(rig.a, 0), TP(rig.a, 1), TP(rig.b, 0)
    rig.consumer.tps = {fetched, unfetched, uncounted}
    rig.consumer.highwaters = {fetched: 3, unfetched: None, uncounted: 8}
    rig.consumer._committed_offset.update({fetched: 3, unfetched: 2})   # uncounted: the broker said nothing
    rig.tick()
    assert committed(fetched) == 3 and uncommitted(fetched) == 0
    assert committed(unfetched) is None and uncommitted(unfetched) is None
    assert committed(uncounted) is None


def test_a_failing_consumer_is_logged_and_the_next_tick_exports() -> None:
    rig = Rig()
    a0, b0 = TP(rig.a, 0), TP(rig.b, 0)
    rig.consumer.tps = {a0, b0}
    rig.consumer.highwaters = {a0: 10, b0: 10}
    rig.consumer._committed_offset[a0] = 4
    rig.consumer.fail = RuntimeError("consumer thread gone")
    with captured_logs() as logs:
        rig.tick()
    assert [line for line in logs.lines if line.startswith("stream_progress_failed")]
    assert "consumer thread gone" in " ".join(logs.lines)
    # the broker does not answer: what Faust knows is exported all the same, the rest logged
    rig.broker_error = TimeoutError("no coordinator")
    with captured_logs() as logs:
        rig.tick()
    assert committed(a0) == 4 and committed(b0) is None
    assert any("stream_progress_failed" in line and "no coordinator" in line for line in logs.lines)


def test_the_task_goes_on_after_a_failing_look() -> None:
    """The service's own loop, started and stopped as the app does: a look that raises, then exports."""
    rig = Rig()
    a0 = TP(rig.a, 0)
    rig.consumer.tps = {a0}
    rig.consumer.highwaters = {a0: 9}
    rig.consumer._committed_offset[a0] = 2
    rig.consumer.fail = RuntimeError("first look fails")
    looks = 0
    exported = asyncio.Event()

    async def main() -> None:
        nonlocal looks
        real = rig.progress.tick

        async def tick() -> None:
            nonlocal looks
            looks += 1
            await real()
            if committed(a0) is not None:
                exported.set()

        rig.progress.tick = tick   # type: ignore[method-assign]
        service = _ProgressService(rig.progress, 0.01)
        await service.start()
        try:
            await asyncio.wait_for(exported.wait(), 30)
        finally:
            await service.stop()

    with captured_logs() as logs:
        asyncio.run(main())
    assert looks >= 2 and committed(a0) == 2 and uncommitted(a0) == 7
    assert any("first look fails" in line for line in logs.lines)


def test_the_interval_is_validated(tmp_path: Path) -> None:
    assert load_settings(None, {"stream": {"data_dir": str(tmp_path)}}).stream.progress_interval_s == 15.0
    for bad in (0, -1, 600, "soon"):
        with pytest.raises(ConfigError, match="progress_interval_s"):
            load_settings(None, {"stream": {"data_dir": str(tmp_path), "progress_interval_s": bad}})


def test_the_worker_app_installs_it(tmp_path: Path) -> None:
    app = build_app(load_settings(None, {"stream": {"data_dir": str(tmp_path / "s"), "progress_interval_s": 2}}))
    services = [d for d in app._children if isinstance(d, _ProgressService)]
    assert progress.source_topics(app) == {"telemetry.lb", "telemetry.ipmi", "telemetry.iptables",
                                           "telemetry.keystone", "telemetry.netperf"}
    assert services and services[0].interval_s == 2


def test_a_never_written_partition_exports_zeros_without_asking_the_broker() -> None:
    """A quiet topic's partitions that never got a record (highwater 0) have nothing committed and nothing waiting:
    the broker is not asked about them at every tick (it is asked on the consumer's thread, beside Faust's own
    commits and seeks)."""
    rig = Rig()
    empty, written = TP(rig.a, 0), TP(rig.a, 1)
    rig.consumer.tps = {empty, written}
    rig.consumer.highwaters = {empty: 0, written: 5}
    rig.broker = {written: 0}   # written, never committed: its log start
    rig.tick()
    assert rig.asked == [[written]]
    assert (committed(empty), uncommitted(empty)) == (0, 0)
    assert (committed(written), uncommitted(written)) == (0, 5)


def test_after_a_failed_broker_look_the_broker_is_left_alone_longer_each_time() -> None:
    rig = Rig()
    a0, b0 = TP(rig.a, 0), TP(rig.b, 0)
    rig.consumer.tps = {a0, b0}
    rig.consumer.highwaters = {a0: 10, b0: 10}
    rig.consumer._committed_offset[a0] = 4          # Faust knows a0; b0 needs the broker
    rig.broker_error = TimeoutError("no coordinator")
    looks = []
    for _ in range(8):
        rig.tick()
        looks.append(len(rig.asked))
        assert committed(a0) == 4                   # what Faust knows is exported at every tick
    # asked at ticks 1, 3 (after 1 skipped), 6 (after 2 skipped): not at every tick
    assert looks == [1, 1, 2, 2, 2, 3, 3, 3]
    rig.broker_error = None
    rig.broker = {b0: 10}
    for _ in range(5):
        rig.tick()
    assert committed(b0) == 10 and rig.progress.broker_failures == 0


def test_the_series_name_the_consumer_group() -> None:
    """Two consumer groups reading one topic are two series: a group's progress must not hide another's stuck
    partition in OpsloopStreamPartitionStuck (which aggregates by group, topic, partition)."""
    rig = Rig()
    a0 = TP(rig.a, 0)
    rig.consumer.tps, rig.consumer.highwaters = {a0}, {a0: 10}
    rig.consumer._committed_offset[a0] = 4
    rig.tick()
    labels = {"group": rig.group, "topic": rig.a, "partition": "0"}
    assert REGISTRY.get_sample_value("opsloop_stream_committed_offset", labels) == 4
    assert REGISTRY.get_sample_value("opsloop_stream_uncommitted_records", labels) == 6
    rig.progress.on_revoked({a0})
    assert REGISTRY.get_sample_value("opsloop_stream_committed_offset", labels) is None
