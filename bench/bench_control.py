"""Control latency of the live edge-weight loop: a request-rate step at HAProxy → new weights applied.

Real components: Kafka (KRaft), an HAProxy edge in front of two origins (near capped at 40 req/s),
the haproxy collector (1 s), the stream worker (edge-demand agent), the edge control service (1 s
interval), the HAProxy applier (``opsloop weights run``), a paced traffic
generator. Each sample: settle at 30 req/s (everything fits the near origin), step to 80 req/s at a
random moment of the collection round, and time until HAProxy's
near weight (read back with ``get weight`` every 20 ms) changes. Timestamps in between give the
breakdown: step → first ``edge.demand`` record showing the rise (collection + rate + stream),
→ first new ``edge.weights`` version (control interval wait + decision + publish),
→ weights read back from HAProxy (actuator). The whole move (until HAProxy's share is within 0.02
of where it settles) is timed too: a shed larger than ``max_step`` takes a second interval.

Baselines in the same run: the loop's own intervals (collector + controller = the unavoidable part;
target: p99 of the rest ≤ 1 s) and the fixed-step baseline's 2 %/origin/15 s damping moving the same
measured share change (ceil(Δshare / 0.02) × 15 s).
"""

from __future__ import annotations

import math
import os
import random
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests
import yaml
from kafka import KafkaConsumer, TopicPartition

from opsloop.controllers.edge.service.api_token import create_token_file
from opsloop.config import StackSettings
from opsloop.lb.haproxy import HaproxyAPI
from opsloop.lab.edge import EdgeSpec, OriginSpec, haproxy_process, origin_process
from opsloop.lab.traffic import TrafficGenerator
from opsloop.stack import ManagedProcess, Stack, free_port

REPO = Path(__file__).resolve().parent.parent
COLLECT_S = 1.0
CONTROL_S = 1.0
LOW, HIGH = 30.0, 80.0
NEAR_CAPACITY = 40.0
FIXED_STEP, FIXED_STEP_INTERVAL_S = 0.02, 15.0  # the fixed-step baseline
LISTENER, BACKEND = "web", "be_web"


class Arrivals:
    """Monotonic arrival times of records on a topic (read from its end) in a daemon thread."""

    def __init__(self, bootstrap: str, topic: str, decode) -> None:
        self.bootstrap, self.topic, self.decode = bootstrap, topic, decode
        self.seen: list[tuple[float, Any]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        c = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                          fetch_max_wait_ms=20)
        try:
            parts = None
            while not parts and not self.stop.is_set():
                parts = c.partitions_for_topic(self.topic)
                time.sleep(0.2)
            tps = [TopicPartition(self.topic, p) for p in parts or ()]
            c.assign(tps)
            c.seek_to_end(*tps)
            for tp in tps:
                c.position(tp)
            self.ready.set()
            while not self.stop.is_set():
                for recs in c.poll(timeout_ms=50).values():
                    t = time.monotonic()
                    with self.lock:
                        self.seen.extend((t, self.decode(r.value)) for r in recs)
        finally:
            c.close()

    def first_after(self, t0: float, pred) -> float | None:
        with self.lock:
            return next((t for t, rec in self.seen if t >= t0 and pred(rec)), None)


def _proc(name: str, args: list[str], tmp: Path, port: int, path: str = "/metrics") -> ManagedProcess:
    p = ManagedProcess(name=name, argv=[sys.executable, *args], workdir=tmp / name,
                       env={"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
                       ready=lambda: requests.get(f"http://127.0.0.1:{port}{path}", timeout=1).ok,
                       ready_timeout_s=90)
    p.start()
    return p


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _near_share(hap: HaproxyAPI) -> float:
    near, far = hap.get_weight(BACKEND, "near")[0], hap.get_weight(BACKEND, "far")[0]
    return near / (near + far) if near + far else 0.0


def _measure(samples: int, tmp: Path, stack: Stack) -> list[dict[str, float]]:
    from opsloop.records import EdgeWeights
    from opsloop.records import EdgeDemand

    procs: list[ManagedProcess] = []
    origins = [OriginSpec("near", free_port(), capacity=NEAR_CAPACITY), OriginSpec("far", free_port(), latency_ms=5)]
    for o in origins:
        procs.append(origin_process(o, tmp / "edge"))
        procs[-1].start()
    spec = EdgeSpec(tmp / "edge", free_port(), origins, listener=LISTENER)
    procs.append(haproxy_process(spec))
    procs[-1].start()
    lb = "bench-edge"
    token = secrets.token_hex(24)
    create_token_file(tmp / "token", token)  # the service refuses a token file others can read
    ports = {k: free_port() for k in ("worker", "collector", "edge_metrics", "api", "actuator")}
    cfg = tmp / "opsloop.yaml"
    cfg.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": stack.kafka_bootstrap},
        "stream": {"app_id": f"bench-control-{secrets.token_hex(4)}", "data_dir": str(tmp / "streams"),
                   "metrics_port": ports["worker"], "web_port": free_port(), "batch_within_s": 0.05},
        "collector": {"interval_s": COLLECT_S, "spool_dir": str(tmp / "spool"), "metrics_port": ports["collector"]},
        "collectors": {"haproxy": {"instances": {lb: str(spec.admin_socket)}}},
        "controllers": {
            "edge": {"interval_s": CONTROL_S, "metrics_port": ports["edge_metrics"],
                     "overrides_file": str(tmp / "edge-overrides.json"),
                     "api": {"port": ports["api"], "token_file": str(tmp / "token")},
                     # the generator is open loop: its rate does not react to latency
                     "controller": {"elasticity": 0.0, "stale_after_s": 10},
                     "topology": {"listeners": [{
                         "name": LISTENER, "backend": BACKEND, "edges": [{"name": lb}],
                         "origins": [{"name": "near", "capacity_rps": NEAR_CAPACITY},
                                     {"name": "far", "capacity_rps": 1000}],
                         "latency_ms": {lb: {"near": 2, "far": 30}}}]}},
            "actuator": {"stale_after_s": 30, "store_dir": str(tmp / "actuator"), "metrics_port": ports["actuator"],
                         "start_offset": "latest",
                         "targets": [{"edge": lb, "listener": LISTENER, "kind": "haproxy",
                                      "socket": str(spec.admin_socket), "backend": BACKEND,
                                      "servers": {"near": "near", "far": "far"}}]}}}))
    cli = ["-m", "opsloop.cli"]
    hap = HaproxyAPI(spec.admin_socket)
    gen: TrafficGenerator | None = None
    demand = weights = None
    try:
        procs.append(_proc("worker", [*cli, "stream", "worker", "--config", str(cfg)], tmp, ports["worker"]))
        procs.append(_proc("collector", [*cli, "collect", "haproxy", "--config", str(cfg)], tmp, ports["collector"]))
        procs.append(_proc("edge", ["-m", "opsloop.controllers.edge.service", "run", "--config", str(cfg)], tmp,
                           ports["api"], "/openapi.json"))
        procs.append(_proc("actuator", [*cli, "weights", "run", "--config", str(cfg), "--edge", lb], tmp,
                           ports["actuator"]))
        demand = Arrivals(stack.kafka_bootstrap, "edge.demand", EdgeDemand.decode)
        weights = Arrivals(stack.kafka_bootstrap, "edge.weights", EdgeWeights.decode)
        auth = {"Authorization": f"Bearer {token}"}

        def status() -> dict[str, Any]:
            return requests.get(f"http://127.0.0.1:{ports['api']}/v1/status", headers=auth, timeout=5).json()[LISTENER]

        gen = TrafficGenerator(f"http://127.0.0.1:{spec.frontend_port}/", LOW, workers=8).start()
        out = []
        phase = random.Random(20261122)
        for _ in range(samples):
            gen.set_rate(LOW)
            # settled: the version has not moved for 4 intervals and HAProxy carries it
            deadline = time.monotonic() + 180
            last_v, last_tick, stable = None, None, 0
            while time.monotonic() < deadline:
                s = status()
                if s.get("tick") != last_tick:
                    stable = stable + 1 if s.get("version") == last_v and s.get("mode") == "normal" else 0
                    last_v, last_tick = s.get("version"), s.get("tick")
                if stable >= 4 and abs(_near_share(hap) - s["weights"][lb]["near"]) < 0.01:
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError(f"the loop did not settle at {LOW} req/s: {status()}")
            before_share, before_version = _near_share(hap), status()["version"]
            before_weight = hap.get_weight(BACKEND, "near")[0]
            # A real change comes at any moment of the collection round: without a random phase every
            # step would land at the same point of the loop (just after a tick) and bias the figure.
            time.sleep(phase.uniform(0.0, COLLECT_S))
            t0 = time.monotonic()
            gen.set_rate(HIGH)
            t_applied = None
            while time.monotonic() - t0 < 60:
                if hap.get_weight(BACKEND, "near")[0] != before_weight:
                    t_applied = time.monotonic()
                    break
                time.sleep(0.02)
            if t_applied is None:
                raise RuntimeError("weights did not change after the step")
            trajectory = [(t_applied, _near_share(hap))]
            while time.monotonic() - t0 < 4 * (COLLECT_S + CONTROL_S):   # the whole move, polled
                trajectory.append((time.monotonic(), _near_share(hap)))
                time.sleep(0.05)
            t_demand = demand.first_after(t0, lambda r: r.edge == lb and r.demand_rps > LOW * 1.2)
            t_decision = weights.first_after(t0, lambda r: r.edge == lb and r.version > before_version)
            # the share the loop moved to, once settled at HIGH (for the fixed-step comparison)
            wait_v = time.monotonic() + 30
            while time.monotonic() < wait_v and status()["mode"] != "normal":
                time.sleep(0.2)
            time.sleep(4 * CONTROL_S)
            after_share = _near_share(hap)
            t_moved = next((t for t, share in trajectory if abs(share - after_share) <= 0.02), trajectory[-1][0])
            out.append({"total": t_applied - t0, "moved": t_moved - t0,
                        "to_demand": (t_demand - t0) if t_demand else math.nan,
                        "to_decision": (t_decision - t_demand) if t_decision and t_demand else math.nan,
                        "to_applied": (t_applied - t_decision) if t_decision else math.nan,
                        "share_moved": abs(before_share - after_share)})
        return out
    finally:
        if gen is not None:
            gen.stop()
        for a in (demand, weights):
            if a is not None:
                a.stop.set()
        for p in reversed(procs):
            p.stop()


def run(quick: bool = False) -> list[dict[str, Any]]:
    samples = 5 if quick else 12
    with tempfile.TemporaryDirectory(prefix="opsloop-bench-control-") as d:
        tmp = Path(d)
        stack = Stack(StackSettings(data_dir=tmp / "stack", kafka_port=free_port(), kafka_controller_port=free_port(),
                                    prometheus_port=free_port(), alertmanager_port=free_port(), scrape_targets=[]),
                      with_alertmanager=False, with_prometheus=False)
        stack.up()
        try:
            res = _measure(samples, tmp, stack)
        finally:
            stack.down()
    total = [r["total"] for r in res]
    intervals = COLLECT_S + CONTROL_S
    beyond = [t - intervals for t in total]
    p50, p99 = statistics.median(total), _pct(total, 0.99)
    moved = statistics.median(r["share_moved"] for r in res)
    moved_p50 = statistics.median(r["moved"] for r in res)
    fixed_s = math.ceil(moved / FIXED_STEP - 1e-9) * FIXED_STEP_INTERVAL_S if moved > 0 else 0.0

    def part(key: str) -> float:
        vals = [r[key] for r in res if not math.isnan(r[key])]
        return round(statistics.median(vals), 3) if vals else math.nan

    rows = [
        {"benchmark": "edge control latency (rate step → weights in HAProxy)", "metric": "p50", "value": round(p50, 3),
         "baseline": "collector + control interval", "baseline_value": intervals, "ratio": round(p50 / intervals, 3),
         "unit": "s", "target": "report", "ok": None},
        {"benchmark": "edge control latency (rate step → weights in HAProxy)", "metric": "p99", "value": round(p99, 3),
         "baseline": "collector + control interval", "baseline_value": intervals, "ratio": round(p99 / intervals, 3),
         "unit": "s", "target": "p99 − intervals ≤ 1 s", "ok": _pct(beyond, 0.99) <= 1.0},
        {"benchmark": "edge control vs fixed-step damping", "metric": f"p50 time to move the near share by {moved:.2f}",
         "value": round(moved_p50, 3), "baseline": "fixed-step: 2 %/origin per 15 s interval",
         "baseline_value": fixed_s, "ratio": round(moved_p50 / fixed_s, 4) if fixed_s else 0.0, "unit": "s",
         "target": "ratio < 1", "ok": moved_p50 < fixed_s},
    ]
    for key, what in (("to_demand", "step → first edge.demand showing it (collect + rate + stream)"),
                      ("to_decision", "edge.demand → new edge.weights version (interval wait + decide)"),
                      ("to_applied", "edge.weights → HAProxy read-back (actuator)")):
        rows.append({"benchmark": "edge control latency breakdown", "metric": f"p50 {what}", "value": part(key),
                     "baseline": "-", "baseline_value": 0.0, "ratio": 0.0, "unit": "s", "target": "report",
                     "ok": None})
    return rows


if __name__ == "__main__":
    from bench.single import main

    raise SystemExit(main("bench.bench_control", __doc__, run))
