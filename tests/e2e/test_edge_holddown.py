"""Hold-down and ramp-in of a flapping origin on the live edge loop, asserted on what HAProxy applied and served.

The same pipeline as ``test_edge_loop.py`` (traffic → real HAProxy → origins; haproxy collector → Kafka →
stream worker → ``edge.demand`` → edge control service → ``edge.weights`` → actuator → HAProxy runtime API),
with the controller's hold-down at its defaults (2 intervals, doubling per flap) and a 1 s interval; its flap
count is kept over 16 intervals instead of 8 (the controller forgets flaps after an origin stayed down that
long, and on a busy machine the pipeline alone can take a few seconds to see it return).

The near origin flaps twice (health file down, then up as soon as the controller has seen it DOWN):

* after each return it is **held down**: the controller's decisions keep its share at 0 for the hold-down's
  intervals, HAProxy keeps its weight at 0 although its own check reports it UP, and it serves no request;
* then it is **ramped in**: its share rises over several intervals, by at most ``relax_step`` per interval,
  and HAProxy applies each step (the actuator's history, read back) and sends it a growing part of the
  requests;
* the second flap, soon after the first, is held down **longer** (back-off).

Then every origin goes DOWN: the controller holds the weights in force (mode ``hold``), HAProxy keeps them
(never all-zero) and a critical ``edge.capacity_shortfall`` names the edge served nothing.

Everything is counted in controller intervals (the decisions published on ``edge.weights``, one per tick) and
in HAProxy's request counters; no duration is asserted.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from opsloop.controllers.actuators.store import WeightStore
from opsloop.lab.traffic import TrafficGenerator
from opsloop.lb.haproxy import HaproxyAPI, parse_show_stat
from opsloop.records import EdgeWeights
from opsloop.topics import Topic
from tests.e2e.pipeline import (BACKEND, HTTP_CLASSES, LISTENER, EdgeControl, applied, loop_config,
                                start_collector, start_weight_actuator, start_worker, stop_all, wait_ticks)
from tests.helpers import findings_read, read_topic, wait_until

pytestmark = pytest.mark.integration

RATE = 80.0
NEAR_CAPACITY = 40.0
HOLD_DOWN = 2           # the controller's default hold_down_intervals
BACKOFF = 2             # and hold_down_backoff
RELAX_STEP = 0.2        # the largest share a relax step moves per interval (controller default)


@dataclass
class Sample:
    """One read of HAProxy's view of the near server."""

    weight: int
    status: str
    requests: int


class HaproxyWatch:
    """Samples HAProxy's near server (weight, check status, requests sent) every 50 ms in a thread."""

    def __init__(self, api: HaproxyAPI) -> None:
        self.api = api
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="haproxy-watch")

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for row in parse_show_stat(self.api.show_stat()):
                if row["pxname"] == BACKEND and row["svname"] == "near":
                    sent = sum(int(row.get(f"hrsp_{c}") or 0) for c in HTTP_CLASSES)
                    self.samples.append(Sample(int(row["weight"]), row["status"], sent))

    def __enter__(self) -> "HaproxyWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def flap(health_file: Path, ctl: EdgeControl) -> None:
    """Near DOWN until the controller has seen it, then UP; returns once its ramp-in is over."""
    health_file.write_text("down")
    wait_until(lambda: ctl.status().get("checks_down") == ["near"], timeout=60, interval=0.1,
               what="the controller seeing near DOWN")
    health_file.write_text("up")
    wait_until(lambda: (s := ctl.status())["healthy"]["near"] and "holding down" not in s["reason"]
               and "ramping in" not in s["reason"], timeout=120, interval=0.2,
               what="near held down, then ramped in")


def returns(decisions: list[EdgeWeights]) -> list[list[EdgeWeights]]:
    """The decisions of each return of near: the runs of ticks holding it down, then ramping it in."""
    runs: list[list[EdgeWeights]] = []
    current: list[EdgeWeights] | None = None
    for d in decisions:
        if "holding down" in d.reason or "ramping in" in d.reason:
            if current is None:
                current = []
                runs.append(current)
            current.append(d)
        else:
            current = None
    return runs


def test_flapping_origin_held_down_ramped_in_backed_off_then_all_down_held_on_haproxy(
        stack, lab_edge, tmp_path: Path) -> None:
    lab_edge.start(capacities={"near": NEAR_CAPACITY})
    loop = loop_config(tmp_path, stack, lab_edge.admin_socket, NEAR_CAPACITY,
                       controller={"hold_down_max_intervals": 16})
    hap = HaproxyAPI(lab_edge.admin_socket)
    worker = start_worker(tmp_path, loop.config, loop.doc, stack)
    collector = start_collector("haproxy", tmp_path, loop.config, loop.doc, stack)
    ctl = EdgeControl(loop.config, tmp_path / "edge-control", loop.api_port, loop.token).start()
    actuator = start_weight_actuator(tmp_path, loop, stack)
    gen = TrafficGenerator(lab_edge.url, RATE, workers=8).start()
    health_file = lab_edge.origins[0].health_file(lab_edge.workdir)
    try:
        wait_until(lambda: (s := ctl.status()).get("mode") == "normal" and s["weights"][loop.lb]["near"] > 0.3,
                   timeout=120, interval=0.5, what="the controller sharing live demand between near and far")
        applied(hap, ctl, loop.lb)
        with HaproxyWatch(hap) as watch:
            flap(health_file, ctl)
            flap(health_file, ctl)
            applied(hap, ctl, loop.lb)
            wait_ticks(ctl, 1)
        # then every origin DOWN: the controller holds (fail static) and HAProxy keeps the weights in force
        # (one origin seen DOWN first may have taken the other's share; the actuator refuses that move if
        # HAProxy saw both DOWN before it came: either way, what HAProxy has two ticks on it keeps)
        for origin in lab_edge.origins:
            origin.health_file(lab_edge.workdir).write_text("down")
        seen_down = wait_until(lambda: (s := ctl.status()).get("checks_down") == ["far", "near"] and s, timeout=60,
                               interval=0.1, what="the controller seeing every origin DOWN")
        wait_ticks(ctl, 2)
        before = {o: hap.get_weight(BACKEND, o)[0] for o in ("near", "far")}
        all_down = wait_ticks(ctl, 3)
        after = {o: hap.get_weight(BACKEND, o)[0] for o in ("near", "far")}
    finally:
        stop_all(gen, actuator, ctl, collector, worker)

    # the controller's side: every decision it published for this edge, one per tick (selected by the
    # record key first: other tests put deliberately bad records on the shared topic)
    key = f"{LISTENER}|{loop.lb}".encode()
    decisions = [EdgeWeights.decode(r.value) for r in read_topic(stack.kafka_bootstrap, Topic.EDGE_WEIGHTS.value)
                 if r.key == key]
    assert decisions and all(d.edge == loop.lb and d.listener == LISTENER for d in decisions)
    first, second = returns(decisions)
    for ret in (first, second):
        held = [d for d in ret if "holding down" in d.reason]
        ramp = [d for d in ret if "holding down" not in d.reason]
        assert all(d.weights["near"] == 0.0 for d in held), [(d.weights, d.reason) for d in held]
        shares = [d.weights["near"] for d in ramp]
        # ramped: rising over several intervals, never more than a relax step at a time
        assert len(shares) >= 3 and shares[0] > 0, shares
        steps = [b - a for a, b in zip([0.0, *shares], shares)]
        assert all(-1e-9 <= s <= RELAX_STEP + 1e-9 for s in steps), shares
    held1 = sum("holding down" in d.reason for d in first)
    held2 = sum("holding down" in d.reason for d in second)
    # held for the hold-down's intervals, and the second flap, soon after, for the backed-off ones
    assert held1 == HOLD_DOWN, [d.reason for d in first]
    assert held2 == HOLD_DOWN * BACKOFF, [d.reason for d in second]

    # HAProxy's side: the actuator applied each of those steps (its history: the shares written and read back)
    history = WeightStore(Path(loop.doc["controllers"]["actuator"]["store_dir"]), loop.lb, LISTENER).history()
    applied_share = {(e.epoch, e.version): e.shares["near"] for e in history if e.action == "apply"}
    for ret in (first, second):
        steps = [(d.weights["near"], applied_share[(d.epoch, d.version)]) for d in ret
                 if d.weights["near"] > 0 and (d.epoch, d.version) in applied_share]
        assert len(steps) >= 3, steps
        assert all(abs(want - got) <= 0.01 for want, got in steps), steps
        assert [got for _, got in steps] == sorted(got for _, got in steps), steps

    # every origin DOWN: held, not all-zero, and paged naming the edge served nothing
    assert all_down["mode"] == "hold" and "no healthy origin" in all_down["reason"], all_down
    assert all_down["version"] == seen_down["version"] and all_down["weights"] == seen_down["weights"], all_down
    assert after == before and sum(after.values()) > 0, (before, after)
    shortfall = [f for _, f in findings_read(read_topic(stack.kafka_bootstrap, Topic.FINDINGS.value))
                 if f.detector == "edge.capacity_shortfall"
                 and f"nothing served at edge(s) {loop.lb}" in f.explanation]
    assert shortfall and shortfall[0].severity.value == "critical", shortfall

    # and what it served: after each drop to weight 0, while HAProxy's own check said UP but the weight was
    # still 0 (held down), near got no request; weighted in again, it served requests
    samples = watch.samples
    drops = [i for i, (a, b) in enumerate(zip(samples, samples[1:])) if a.weight > 0 and b.weight == 0]
    assert len(drops) == 2, drops    # two flaps, each taking near to weight 0 once
    for start, end in zip(drops, [*drops[1:], len(samples)]):
        seg = samples[start + 1:end]
        held_up = [(a, b) for a, b in zip(seg, seg[1:]) if a.weight == b.weight == 0 and a.status == b.status == "UP"]
        assert held_up, "HAProxy never showed near UP with weight 0 (held down)"
        assert all(b.requests == a.requests for a, b in held_up), [p for p in held_up if p[1].requests != p[0].requests]
        assert seg[-1].weight > 0 and seg[-1].requests > held_up[-1][1].requests, "near unserved after its ramp-in"
    assert len({s.weight for s in samples if s.weight > 0}) >= 4     # the ramp's steps reached HAProxy
