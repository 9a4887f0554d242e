"""Scale-out: stream workers with the same app id share the partitions of the telemetry topics.

One worker runs first (the single-worker result); a second one joins during the run. Checked:
* the consumer group (kafka-python admin ``describe_consumer_groups``) has two members whose assignments
  are disjoint and together cover every partition of the topics;
* per-server request rates are the same as with one worker; after the LBs' rates change, each LB's new
  rate shows in exactly the worker that holds its partition (the producer's partitioner; which worker
  holds which partition: each worker's own /metrics, equal to the broker's member assignments), in a
  look across which neither worker's assignment changed;
* firewall findings: one ``opened`` per unprotected port over the whole run, none lost, none repeated,
  although partitions (and their detector state) moved to the new worker in between;
* the second worker SIGKILLed mid-run: the first takes every partition back, serves every LB's (new)
  rate, and findings still open exactly once (no loss, no repeat after the take-over).

Both workers run under :class:`opsloop.stack.supervisor.Supervisor`, as production runs them (``opsloop
run``; systemd ``Restart=on-failure``): a worker whose table recovery stalls exits (the recovery
watchdog, streams/runtime/watchdog.py) and is restarted, so every wait below ends — with the result or
with its deadline, never on a worker that will not recover. A restarted worker restores its detector
state from the table, so "opened exactly once" holds across it. (The second worker is no longer
supervised once it is SIGKILLed on purpose.)
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Callable, NamedTuple, TypeVar

import pytest
from kafka import KafkaProducer

from opsloop.stack import Stack
from opsloop.stack.supervisor import Supervisor
from opsloop.topics import Topic
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import (findings_read, metric_samples, metric_value, read_topic, samples_named, unique, wait_until,
                           write_config)
from tests.scale.workload import (PARTITIONS, fw_round, group_assignment, lb_round, partition_of,
                                  second_worker_config)

pytestmark = pytest.mark.integration

N_LBS = 8
N_HVS = 8
TOPICS = (Topic.LB, Topic.IPTABLES)
T = TypeVar("T")


def opened_per_hypervisor(bootstrap: str, hvs: list[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for r, f in findings_read(read_topic(bootstrap, Topic.FINDINGS.value, timeout_s=30)):
        if f.detector == "firewall.unprotected_port" and f.where.get("hypervisor") in hvs:
            if dict(r.headers or []).get("event") == b"opened":
                out[f.where["hypervisor"]] += 1
    return out


class Holdings(NamedTuple):
    """What each worker's /metrics says it holds (streams/runtime/assignment.py), worker by worker."""

    rebalances: tuple[float, ...]
    lb_partitions: tuple[frozenset[int], ...]


def holdings(ports: list[int]) -> Holdings:
    counts, held = [], []
    for port in ports:
        page = metric_samples(port)
        counts.append(metric_value(page, "opsloop_stream_rebalances_total") or 0.0)
        held.append(frozenset(int(labels["partition"]) for labels, v in
                              samples_named(page, "opsloop_stream_partition_assigned", {"topic": Topic.LB.value})
                              if v == 1))
    return Holdings(tuple(counts), tuple(held))


def sharing(h: Holdings) -> bool:
    """Every worker holds some LB partitions, none holds one twice, together they hold them all."""
    a, b = h.lb_partitions
    return bool(a and b) and not a & b and a | b == set(range(PARTITIONS))


def lb_partitions_of_members(group: dict[str, set[tuple[str, int]]]) -> list[list[int]]:
    """The broker's view: each member's LB partitions, sorted (member ids do not say which process)."""
    return sorted(sorted(p for t, p in parts if t == Topic.LB.value) for parts in group.values())


def restarts(supervisors: list[Supervisor]) -> list[tuple[str, int | None]]:
    return [(ev.name, ev.exit_code) for sup in supervisors for ev in sup.events]


def test_second_worker_shares_partitions_without_losing_or_repeating(stack: Stack, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    config, doc = pipeline_config(tmp_path, stack)
    doc["kafka"]["partitions"] = PARTITIONS
    doc.setdefault("streams", {})["detectors"] = {"anomaly": {"enabled": False}}
    write_config(config, doc)
    app_id = doc["stream"]["app_id"]
    tag = unique("scale")
    lbs = [f"{tag}-lb{i}" for i in range(N_LBS)]
    hvs = [f"{tag}-hv{i}" for i in range(N_HVS)]
    per_s = {lb: 10 * (i + 1) for i, lb in enumerate(lbs)}    # requests per second of each LB
    counters = {lb: 0 for lb in lbs}
    assert len({partition_of(lb) for lb in lbs}) > 1, "test data must spread over partitions"
    t0 = time.time() - 600
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    rounds = iter(range(10_000))

    def send_round(hv_list: list[str]) -> int:
        n = next(rounds)
        for lb in lbs:
            counters[lb] += per_s[lb] if n else 0
            sent = producer.send(Topic.LB.value, key=lb.encode(), value=lb_round(lb, counters[lb], t0 + n))
            if n == 0:   # the partitioner as this test computes it is the one the producer used
                assert sent.get(timeout=30).partition == partition_of(lb)
        for hv in hv_list:
            producer.send(Topic.IPTABLES.value, key=hv.encode(), value=fw_round(hv, t0 + n))
        producer.flush()
        return n

    def rates(port: int) -> dict[str, float]:
        page = metric_samples(port)   # one request for every LB
        return {lb: v for lb in lbs
                if (v := metric_value(page, "opsloop_lb_server_requests_per_second", {"lb": lb, "server": "s1"})) is not None}

    w1 = start_worker(tmp_path, config, doc, stack)
    supervisors = [Supervisor([w1], max_restarts=3, window_s=600, backoff_s=0.5, max_backoff_s=2.0)]
    w2 = None

    def supervised(fn: Callable[[], T]) -> Callable[[], T]:
        """``fn`` after the supervisors restarted any worker that exited."""
        def check() -> T:
            for sup in supervisors:
                sup.check()
            return fn()
        return check
    try:
        # --- one worker: the reference result
        for _ in range(3):
            send_round(hvs[: N_HVS // 2])
        single = wait_until(supervised(lambda: (r := rates(doc["stream"]["metrics_port"])) and len(r) == N_LBS and r),
                            timeout=90, what="rates from the single worker")
        assert single == pytest.approx({lb: float(v) for lb, v in per_s.items()})
        wait_until(supervised(lambda: len(opened_per_hypervisor(bootstrap, hvs)) == N_HVS // 2), timeout=60,
                   what="findings from the single worker")
        members = wait_until(supervised(lambda: group_assignment(bootstrap, app_id)), timeout=60, what="stable group")
        assert len(members) == 1

        # --- a second worker joins during the run (rounds go on while the group rebalances)
        config2, doc2 = second_worker_config(tmp_path, doc)
        w2 = start_worker(tmp_path / "w2", config2, doc2, stack)
        supervisors.append(Supervisor([w2], max_restarts=3, window_s=600, backoff_s=0.5, max_backoff_s=2.0))

        def shared() -> dict[str, set[tuple[str, int]]] | None:
            send_round(hvs)
            g = group_assignment(bootstrap, app_id)
            return g if len(g) == 2 and all(g.values()) else None
        members = wait_until(supervised(shared), timeout=120, interval=1, what="two members sharing the partitions")
        # Faust also assigns the changelog partitions to both (active + standby) and its leader topic:
        # the telemetry topics are the ones whose records must be processed exactly by one worker.
        a, b = ({tp for tp in parts if tp[0].startswith("telemetry.")} for parts in members.values())
        assert not a & b, f"a telemetry partition is assigned to both workers: {sorted(a & b)}"
        for topic in TOPICS:
            want = {(topic.value, p) for p in range(PARTITIONS)}
            assert want <= a | b, f"{topic.value}: partitions without a worker"
            assert (a & want) and (b & want), f"{topic.value}: one worker holds all partitions"

        # --- the LBs' request rates change: each new rate must come from exactly the worker holding its
        # partition. Which one holds it, and whether a rebalance came in between, each worker says itself
        # (streams/runtime/assignment.py): a member that missed heartbeats on a loaded machine, or was
        # restarted by its supervisor, rejoins and the group rebalances again. Then the look is void (the old
        # owner may have shown the new rate in between) and the rates change again, to values no worker
        # has shown yet, until one look sees a group that stayed as it was.
        ports = [doc["stream"]["metrics_port"], doc2["stream"]["metrics_port"]]
        first_new = send_round(hvs)
        looks: list[Holdings] = []

        def served() -> tuple[dict[str, list[int]], Holdings, list[list[int]]] | None:
            nonlocal per_s
            before = holdings(ports)
            send_round(hvs)
            if not sharing(before):
                return None
            if not looks or looks[-1] != before:   # the first look, or a rebalance since the last change
                looks.append(before)
                per_s = {lb: v * (len(looks) + 1) // len(looks) for lb, v in per_s.items()}
                return None
            by_worker = [rates(p) for p in ports]
            owners = {lb: [k for k in (0, 1) if by_worker[k].get(lb) == pytest.approx(per_s[lb])] for lb in lbs}
            # the workers' own view against the group's, read while neither changed
            group = lb_partitions_of_members(group_assignment(bootstrap, app_id))
            if not all(owners.values()) or holdings(ports) != before or not group:
                return None
            return owners, before, group
        try:
            owners, held, group = wait_until(supervised(served), timeout=120, interval=1,
                                             what="the new rates from the owning workers")
        except AssertionError as e:
            raise AssertionError(f"{e}; looks (rebalances, lb partitions per worker): {looks}; "
                                 f"restarts {restarts(supervisors)}") from None
        holder = {lb: [k for k in (0, 1) if partition_of(lb) in held.lb_partitions[k]] for lb in lbs}
        assert owners == holder, (owners, held)
        # each worker's LB partitions are exactly one member's, as the broker reports the group
        assert group == sorted(sorted(p) for p in held.lb_partitions), (group, held)

        # --- every hypervisor's rounds after the rebalance processed by one of the workers
        def processed() -> bool:
            last = send_round(hvs)
            pages = [metric_samples(p) for p in ports]
            ts = [max((metric_value(page, "opsloop_firewall_report_timestamp_seconds", {"hypervisor": hv}) or 0)
                      for page in pages) for hv in hvs]
            return all(t >= t0 + first_new for t in ts) and last > first_new
        wait_until(supervised(processed), timeout=120, interval=1, what="every hypervisor's new rounds processed")

        # Findings: one "opened" per unprotected port over the whole run (no loss, no repeat across the move).
        opened = wait_until(supervised(lambda: (o := opened_per_hypervisor(bootstrap, hvs)) and len(o) == N_HVS and o),
                            timeout=60, what="findings of all hypervisors")
        assert opened == {hv: 1 for hv in hvs}, opened
        assert w1.running() and w2.running()

        # --- the second worker is SIGKILLed mid-run: the first takes over every partition (after the
        # session timeout), restores the moved state, and new problems still open exactly once.
        supervisors.pop()
        w2.kill()
        late = [f"{tag}-late{i}" for i in range(4)]

        def taken_over() -> dict[str, set[tuple[str, int]]] | None:
            send_round(hvs + late)
            g = group_assignment(bootstrap, app_id)
            return g if len(g) == 1 else None
        (alone,) = wait_until(supervised(taken_over), timeout=120, interval=1, what="the survivor owning everything").values()
        for topic in TOPICS:
            assert {(topic.value, p) for p in range(PARTITIONS)} <= alone
        per_s = {lb: 3 * v // 2 for lb, v in per_s.items()}

        last: dict[str, float] = {}

        def survivor_rates() -> dict[str, float] | None:
            send_round(hvs + late)
            last.update(r := rates(ports[0]))
            return r if all(r.get(lb) == pytest.approx(per_s[lb]) for lb in lbs) else None
        try:
            wait_until(supervised(survivor_rates), timeout=120, interval=1, what="every LB's new rate from the survivor")
        except AssertionError as e:
            # Seen once in CI, not reproduced: say which LBs (partitions) lag and what the worker logged.
            lagging = {lb: (partition_of(lb), last.get(lb), per_s[lb]) for lb in lbs
                       if last.get(lb) != pytest.approx(per_s[lb])}
            raise AssertionError(f"{e}; lagging lb: (partition, rate, want) {lagging}; "
                                 f"group {group_assignment(bootstrap, app_id)}; restarts {restarts(supervisors)}; "
                                 f"worker log:\n{w1.tail(40)}") from None
        everyone = hvs + late
        opened = wait_until(supervised(lambda: (o := opened_per_hypervisor(bootstrap, everyone))
                                       and len(o) == len(everyone) and o), timeout=60, what="findings after the take-over")
        assert opened == {hv: 1 for hv in everyone}, opened
        assert w1.running()
    finally:
        producer.close()
        if w2 is not None:
            w2.stop()
        w1.stop()
