"""A stream worker that freezes (SIGSTOP: a paused VM, a GC or swap storm, a hung disk) and later resumes.

Two workers share the partitions (as in test_scale_out.py). One is frozen right after a round that
reports new hypervisors (its fetched, maybe half-processed, batch is then in flight inside the frozen
process), and the rounds go on. Checked:

* the stage does not stall: the group (kafka-python admin, the broker's view) ends with the other worker
  alone holding every partition, which shows every LB's new rate, opens the findings of hypervisors
  first reported during the freeze and clears those whose port got protected meanwhile;
* the frozen worker resumes (SIGCONT) with its stale in-memory view: the group again has two members
  whose assignments are disjoint and cover every telemetry partition, the resumed process is the same
  one (no crash, no restart), and new hypervisors reported after the resume open their findings;
* over the whole run, in the ``findings`` topic: one ``opened`` per hypervisor (none lost, none repeated
  by the zombie's in-flight batch or its stale state), one ``cleared`` for each fixed port and nothing
  after it (the zombie neither re-opens nor refreshes a finding the survivor cleared), and no clear of a
  finding still open; and across both workers' /metrics each open finding is shown open exactly once,
  the cleared ones by neither.

The frozen worker is always SIGCONTed (``finally``) and every process is stopped by its PID.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest
from kafka import KafkaProducer

from opsloop.stack import ManagedProcess, Stack
from opsloop.stack.process import pid_alive
from opsloop.stack.supervisor import Supervisor
from opsloop.topics import Topic
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import findings_read, metric_samples, read_topic, samples_named, unique, wait_until, write_config
from tests.scale.workload import (PARTITIONS, Telemetry, group_assignment, keys_covering, partition_of,
                                  second_worker_config)

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_S = 6.0   # the lowest the settings allow: a quick take-over keeps the test short
TOPICS = (Topic.LB, Topic.IPTABLES)
DETECTOR = "firewall.unprotected_port"


class Frozen:
    """SIGSTOP one process by PID; :meth:`resume` (idempotent) SIGCONTs it — call it in a ``finally``."""

    def __init__(self, proc: ManagedProcess) -> None:
        rec = proc.read_pid()
        assert rec is not None and pid_alive(*rec), f"{proc.name} is not running"
        self.pid, self.start_time = rec
        self.stopped = False

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        if self.stopped and pid_alive(self.pid, self.start_time):
            os.kill(self.pid, signal.SIGCONT)
        self.stopped = False

    def same_process_running(self, proc: ManagedProcess) -> bool:
        return proc.read_pid() == (self.pid, self.start_time) and pid_alive(self.pid, self.start_time)


def lifecycles(bootstrap: str, hvs: list[str]) -> dict[str, list[str]]:
    """Hypervisor -> the events of its unprotected-port finding, in topic order (one partition per id)."""
    out: dict[str, list[str]] = defaultdict(list)
    for r, f in findings_read(read_topic(bootstrap, Topic.FINDINGS.value, timeout_s=30)):
        if f.detector == DETECTOR and f.where.get("hypervisor") in hvs:
            out[f.where["hypervisor"]].append((dict(r.headers or []).get("event") or b"?").decode())
    return dict(out)


def opened_once(events: dict[str, list[str]], hvs: list[str],
                replayed: set[str] | frozenset[str] = frozenset()) -> bool:
    """Each of ``hvs`` opened once; those in ``replayed`` (sent by a worker just before it froze) once or twice:
    the new owner replaying that batch sends them again (at-least-once, the final check's one allowance)."""
    return all(events.get(hv, []).count("opened") in ((1, 2) if hv in replayed else (1,)) for hv in hvs)


def shown_open(ports: list[int], hvs: list[str]) -> dict[str, int]:
    """Hypervisor -> how many workers show its finding open in /metrics (``opsloop_finding_active`` 1)."""
    out = {hv: 0 for hv in hvs}
    for port in ports:
        for labels, v in samples_named(metric_samples(port), "opsloop_finding_active", {"detector": DETECTOR}):
            if v == 1 and labels.get("hypervisor") in out:
                out[labels["hypervisor"]] += 1
    return out


def iptables_held(port: int) -> set[int]:
    """The ``telemetry.iptables`` partitions a worker says it holds (streams/runtime/assignment.py)."""
    return {int(labels["partition"]) for labels, v in samples_named(
        metric_samples(port), "opsloop_stream_partition_assigned", {"topic": Topic.IPTABLES.value}) if v == 1}


def logged(proc: ManagedProcess, since: int = 0) -> list[dict[str, object]]:
    """The JSON log events a worker wrote from byte ``since`` of its log on."""
    with open(proc.logfile, "rb") as f:
        f.seek(since)
        lines = f.read().decode(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def opened_in(events: list[dict[str, object]]) -> set[str]:
    return {f["where"]["hypervisor"] for e in events if e.get("event") == "finding"   # type: ignore[index]
            and (f := e.get("fields")) and f.get("kind") == "opened"}   # type: ignore[union-attr]


def telemetry_partitions(group: dict[str, set[tuple[str, int]]]) -> list[set[tuple[str, int]]]:
    return [{tp for tp in parts if tp[0] in {t.value for t in TOPICS}} for parts in group.values()]


def test_frozen_worker_neither_stalls_the_stage_nor_repeats_findings_after_it_resumes(
        stack: Stack, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    config, doc = pipeline_config(tmp_path, stack)
    doc["kafka"]["partitions"] = PARTITIONS
    doc["stream"]["session_timeout_s"] = SESSION_TIMEOUT_S
    doc.setdefault("streams", {})["detectors"] = {"anomaly": {"enabled": False}}
    write_config(config, doc)
    app_id = doc["stream"]["app_id"]
    tag = unique("freeze")
    lbs = keys_covering(f"{tag}-lb", 2)
    early = keys_covering(f"{tag}-hv", 2)       # open before the freeze
    fixed = keys_covering(f"{tag}-hv", 1)       # of those, protected during the freeze (one per partition)
    during = keys_covering(f"{tag}-mid", 1)     # first reported in the round the worker freezes after
    late = keys_covering(f"{tag}-late", 1)      # first reported after it resumed
    assert set(fixed) <= set(early)
    everyone = early + during + late
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    tel = Telemetry(producer, lbs, everyone, time.time() - 600)

    config2, doc2 = second_worker_config(tmp_path, doc)
    ports = [doc["stream"]["metrics_port"], doc2["stream"]["metrics_port"]]
    w1 = start_worker(tmp_path, config, doc, stack)
    w2: ManagedProcess | None = None
    frozen: Frozen | None = None
    # The survivor is supervised as in production (a stalled recovery exits and is restarted); the worker
    # that freezes is not: it has to come back by itself, as the same process.
    sup = Supervisor([w1], max_restarts=3, window_s=600, backoff_s=0.5, max_backoff_s=2.0)

    def group_of(n: int) -> dict[str, set[tuple[str, int]]] | None:
        g = group_assignment(bootstrap, app_id)
        return g if len(g) == n and all(telemetry_partitions(g)) else None

    def sharing() -> list[set[tuple[str, int]]] | None:
        sup.check()
        tel.send(early)
        g = group_of(2)
        return telemetry_partitions(g) if g else None

    def log_tails() -> str:
        return (f"restarts {[(e.name, e.exit_code) for e in sup.events]}\nw1:\n{w1.tail(30)}\n"
                f"w2:\n{w2.tail(30) if w2 else ''}")

    try:
        w2 = start_worker(tmp_path / "w2", config2, doc2, stack)
        frozen = Frozen(w2)
        # --- two workers share the partitions and have opened the early findings
        a, b = wait_until(sharing, timeout=120, interval=1, what="two workers sharing the partitions")
        assert not a & b and len(a | b) == len(TOPICS) * PARTITIONS, (a, b)
        since = tel.send(early)

        def both_serving() -> bool:
            """Each worker handles the rounds of its own partitions and shows their findings open (so the
            one about to freeze holds live detector state and is mid-stream)."""
            sup.check()
            tel.send(early)
            held = [iptables_held(p) for p in ports]
            if not all(held) or held[0] & held[1] or held[0] | held[1] != set(range(PARTITIONS)):
                return False
            fresh = all(tel.report_ts(ports[k]).get(hv, 0) >= tel.ts(since)
                        for k in (0, 1) for hv in early if partition_of(hv) in held[k])
            return fresh and shown_open(ports, early) == {hv: 1 for hv in early}
        try:
            wait_until(both_serving, timeout=90, interval=1, what="both workers serving their partitions")
        except AssertionError as e:
            raise AssertionError(f"{e}; shown {shown_open(ports, early)}; {log_tails()}") from None
        assert opened_once(lifecycles(bootstrap, early), early), lifecycles(bootstrap, early)

        # --- freeze one worker just after a round reporting new hypervisors (likely fetched, maybe being
        # handled, surely not committed by it), and keep producing
        tel.send(early + during)
        time.sleep(0.1)   # within the worker's 0.2 s batch window: fetched, not yet handled nor committed
        frozen.freeze()
        tel.fixed |= set(fixed)
        tel.scale_rates(2)

        def taken_over() -> set[tuple[str, int]] | None:
            sup.check()
            tel.send(early + during)
            g = group_of(1)
            return telemetry_partitions(g)[0] if g else None
        try:
            alone = wait_until(taken_over, timeout=90, interval=1, what="the other worker owning every partition")
        except AssertionError as e:
            raise AssertionError(f"{e}; group {group_assignment(bootstrap, app_id)}; {log_tails()}") from None
        assert alone == {(t.value, p) for t in TOPICS for p in range(PARTITIONS)}

        # the stage goes on without the frozen worker: every LB's new rate, new findings, clears. What the
        # frozen worker published before the freeze (its log: stopped, nothing more is written) may come again
        # from the survivor replaying that batch (the freeze can land after its publish, before its commit)
        before_freeze = opened_in(logged(w2))

        def survivor_serves() -> bool:
            sup.check()
            tel.send(early + during)
            events = lifecycles(bootstrap, early + during)
            return (not tel.lagging(ports[0], tel.rounds - 1).keys() & set(lbs)
                    and opened_once(events, during, replayed=before_freeze)
                    and all(events.get(hv, [])[-1:] == ["cleared"] for hv in fixed))
        try:
            wait_until(survivor_serves, timeout=90, interval=1, what="the survivor serving every partition")
        except AssertionError as e:
            raise AssertionError(f"{e}; lagging {tel.lagging(ports[0], tel.rounds - 1)}; "
                                 f"findings {lifecycles(bootstrap, early + during)}; {log_tails()}") from None

        # --- the frozen worker resumes: it must find its generation stale, rejoin, and share again
        frozen_at = w2.logfile.stat().st_size   # stopped: nothing more is written until SIGCONT
        frozen.resume()

        def rejoined() -> list[set[tuple[str, int]]] | None:
            sup.check()
            tel.send()
            g = group_of(2)
            return telemetry_partitions(g) if g else None
        try:
            a, b = wait_until(rejoined, timeout=120, interval=1, what="the resumed worker back in the group")
        except AssertionError as e:
            raise AssertionError(f"{e}; group {group_assignment(bootstrap, app_id)}; {log_tails()}") from None
        assert not a & b, f"a telemetry partition is assigned to both workers: {sorted(a & b)}"
        assert a | b == alone, "telemetry partitions without a worker"
        assert frozen.same_process_running(w2), f"the resumed worker exited or was restarted; {log_tails()}"

        # every hypervisor's rounds after the rejoin handled (by one worker or the other), so whatever the
        # resumed worker would publish from its stale view has been published
        since = tel.send()

        def settled() -> bool:
            sup.check()
            tel.send()
            reports = [tel.report_ts(p) for p in ports]
            return all(max(r.get(hv, 0) for r in reports) >= tel.ts(since) for hv in everyone)
        def late_opened() -> bool:
            sup.check()
            tel.send()
            return opened_once(lifecycles(bootstrap, late), late)
        try:
            wait_until(settled, timeout=90, interval=1, what="every hypervisor's rounds after the rejoin handled")
            wait_until(late_opened, timeout=60, interval=1, what="the findings of hypervisors reported after resuming")
        except AssertionError as e:
            raise AssertionError(f"{e}; findings {lifecycles(bootstrap, everyone)}; {log_tails()}") from None

        # Nothing published by the resumed worker before it rejoined (its stale view, its in-flight batch)
        resumed = logged(w2, frozen_at)
        rejoin = next(i for i, e in enumerate(resumed) if e.get("event") == "partitions_assigned")
        stale = [e for e in resumed[:rejoin] if e.get("event") == "finding"]
        assert not stale, f"published by the resumed worker before it rejoined: {stale}"
        # One "opened" per hypervisor, none lost. The one duplicate at-least-once allows (no transactions):
        # a finding the worker sent just before it froze, in the batch whose state write and offset commit
        # the freeze cut off, is sent again by the new owner replaying that batch. Only that.
        events = lifecycles(bootstrap, everyone)
        opened = {hv: events.get(hv, []).count("opened") for hv in everyone}
        repeated = {hv for hv, n in opened.items() if n != 1}
        assert all(n >= 1 for n in opened.values()), f"lost: {events}"
        assert all(opened[hv] == 2 for hv in repeated) and repeated <= set(during) & before_freeze, events
        for hv in everyone:
            life = events[hv]
            assert life[0] == "opened" and life.count("opened") == opened[hv], (hv, life)
            if hv in fixed:   # cleared once, by the survivor; nothing after it (no zombie refresh or re-open)
                assert life.count("cleared") == 1 and life[-1] == "cleared", (hv, life)
            else:
                assert "cleared" not in life, (hv, life)
        # each open finding shown open by exactly one worker, the cleared ones by none (after each worker's
        # first batch since the last rebalance: its restore sets what it shows)
        want = {hv: 0 if hv in fixed else 1 for hv in everyone}

        def shown_once() -> bool:
            sup.check()
            tel.send()
            return shown_open(ports, everyone) == want
        try:
            wait_until(shown_once, timeout=60, interval=1, what="each open finding shown by exactly one worker")
        except AssertionError as e:
            raise AssertionError(f"{e}; shown {shown_open(ports, everyone)}; want {want}") from None
        assert w1.running() and frozen.same_process_running(w2), log_tails()
    finally:
        if frozen is not None:
            frozen.resume()   # never leave a stopped process behind (a SIGTERM would wait on it)
        producer.close()
        if w2 is not None:
            w2.stop()
        w1.stop()
