"""Chaos soak: the whole pipeline of `opsloop run` under steady load while a schedule kills its services.

What runs (all real, on free loopback ports, supervised by the same :class:`Supervisor` as `make run`):
Kafka, Alertmanager (the project's routing, pointed at the lab pager), the lab edge (HAProxy, two
origins, a traffic generator), 9 simulated BMCs, a network-namespace "hypervisor" with Neutron's
iptables layout, the stream worker, the HAProxy, IPMI and iptables collectors, the paging actuator, the
edge control service and the HAProxy weight actuator.

The schedule SIGKILLs each service in turn (the supervisor restarts it), and stops and restarts the
Kafka broker and Alertmanager, while two problems are injected and later repaired: a BMC power jump
(one gen3 server to a gen1 draw) and a deleted security-group chain. At the end it checks:

* every injected problem paged exactly once (one firing notification at the pager) and resolved;
* no sample lost between collector and worker, per series: every record of a collector's series in
  Kafka is below the worker group's committed offset of its partition, and the series has no gap of
  missing rounds outside the collector's own kill windows (a broker restart must not make a gap: the
  spool fills it);
* the HAProxy weights, sampled every 0.5 s, never all zero and never moved more than the actuator's
  step bound (``max_step`` of the shares) between two samples;
* recovery time per kill: from the kill to the service doing its work again (a collector's next round,
  the worker's next batch, a restarted broker with the worker processing and every spool drained; the
  others: serving /metrics again), p50/p99; for the broker and Alertmanager from their restart after
  the outage. The same-run baseline is the service's cold start.

    python -m bench --only soak [--quick]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import orjson
import yaml

from opsloop.config import StackSettings
from opsloop.lb.haproxy import HaproxyAPI
from opsloop.lab.pipeline import LabPorts, _opsloop, alertmanager_config, effective_config, pipeline_processes
from opsloop.stack import ManagedProcess, Stack, StackError, free_port
from opsloop.stack.supervisor import Supervisor

COLLECTOR_TOPICS = ("telemetry.lb", "telemetry.ipmi", "telemetry.iptables")
BMC_COUNT = 9                      # three per generation: a generation's median needs three servers
POWER_VICTIM = "stor-gen3-002"     # a gen3 BMC with DCMI (155 W) ...
JUMP_WATTS, NORMAL_WATTS = 248, 155  # ... jumping to a gen1 draw, and back
PROBLEMS = {"power jump": {"alertname": "PowerGenerationDeviation", "host": POWER_VICTIM},
            "deleted chain": {"alertname": "FirewallUnprotectedPort"}}   # + hypervisor, port at run time


@dataclass(frozen=True)
class Plan:
    cycles: int          # times the kill schedule runs
    gap_s: float         # pause after each recovery
    outage_s: float      # how long the broker / Alertmanager stay down
    interval_s: float = 2.0
    traffic_rate: float = 30.0


QUICK = Plan(cycles=1, gap_s=3.0, outage_s=5.0)
FULL = Plan(cycles=3, gap_s=15.0, outage_s=20.0)


@dataclass
class Kill:
    target: str
    at: float                 # wall-clock time of the kill (or the stop)
    recovered_s: float | None = None


@dataclass
class SoakResult:
    kills: list[Kill]
    cold_start_s: dict[str, float]
    pages: dict[str, dict[str, int]]               # problem -> {"firing": n, "resolved": n}
    lost_in_worker: dict[str, int]                 # series -> records not consumed by the worker
    collector_gaps: dict[str, int]                 # series -> missing rounds outside its collector's kills
    series: int
    samples: int
    weight_samples: int
    unsafe_weights: list[str]
    restarts: int
    other_pages: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return sum(self.lost_in_worker.values()) + sum(self.collector_gaps.values())

    def recovery(self, target: str | None = None) -> list[float]:
        return sorted(k.recovered_s for k in self.kills if k.recovered_s is not None
                      and (target is None or k.target == target))

    def problems_ok(self) -> dict[str, bool]:
        return {p: c["firing"] == 1 and c["resolved"] >= 1 for p, c in self.pages.items()}

    def table(self) -> str:
        lines = [f"{'target':<20} {'kills':>5} {'recovery p50 s':>15} {'p99 s':>8} {'cold start s':>13}"]
        for t in dict.fromkeys(k.target for k in self.kills):
            r = self.recovery(t)
            lines.append(f"{t:<20} {len(r):>5} {pct(r, 50):>15.1f} {pct(r, 99):>8.1f} "
                         f"{self.cold_start_s.get(t, float('nan')):>13.1f}")
        lines.append("")
        for p, c in self.pages.items():
            lines.append(f"problem {p!r}: paged {c['firing']}x, resolved {c['resolved']}x")
        lines.append(f"series {self.series}, samples {self.samples}: lost in worker "
                     f"{sum(self.lost_in_worker.values())}, missing collector rounds {sum(self.collector_gaps.values())}")
        lines.append(f"weights: {self.weight_samples} samples, unsafe {len(self.unsafe_weights)}; "
                     f"supervisor restarts {self.restarts}")
        for what, bad in (("lost in worker", self.lost_in_worker), ("collector gaps", self.collector_gaps)):
            for s, n in list(bad.items())[:5]:
                lines.append(f"  {what}: {s}: {n}")
        lines += [f"  unsafe: {u}" for u in self.unsafe_weights[:5]]
        lines += [f"  other page: {o}" for o in self.other_pages[:10]]
        return "\n".join(lines)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def missing_rounds(times: list[int], down: list[tuple[float, float]], interval_s: float) -> int:
    """Rounds missing from one series' sorted sample times, outside its collector's kill windows. A late
    round can stretch one gap on a loaded machine, so only a gap of more than max(4 intervals, 15 s)
    counts; a broker outage is no excuse (the spool must fill it)."""
    missing = 0
    for a, b in zip(times, times[1:]):
        killed = any(lo - 2 * interval_s <= b and a <= hi + 2 * interval_s for lo, hi in down)
        if b - a > max(4 * interval_s, 15) and not killed:
            missing += round((b - a) / interval_s) - 1
    return missing


def _sh(*argv: str, stdin: str | None = None) -> str:
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r.stdout


class Hypervisor:
    """A network namespace with two VM taps and Neutron's iptables layout (nft backend)."""

    def __init__(self, workdir: Path) -> None:
        from opsloop.collectors.iptables.neutron_layout import LayoutPort

        self.netns = f"opsl-soak-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.host = f"hv-soak-{uuid.uuid4().hex[:6]}"
        self.ports = [LayoutPort(str(uuid.uuid4()), f"10.9.0.{i + 10}", f"fa:16:3e:09:00:{i:02x}") for i in range(2)]
        self.ports_file = workdir / "hv-ports.json"
        self.intact = ""

    def __enter__(self) -> "Hypervisor":
        from opsloop.collectors.iptables.neutron_layout import filter_table

        _sh("ip", "netns", "add", self.netns)
        for p in self.ports:
            _sh("ip", "netns", "exec", self.netns, "ip", "tuntap", "add", "dev", f"tap{p.port_id[:11]}", "mode", "tap")
        self.ports_file.parent.mkdir(parents=True, exist_ok=True)
        self.ports_file.write_text(json.dumps([{"port_id": p.port_id, "vm": f"vm{i}", "tenant": "acme"}
                                               for i, p in enumerate(self.ports)]))
        _sh("ip", "netns", "exec", self.netns, "iptables-nft-restore", stdin=filter_table(self.ports))
        _sh("ip", "netns", "exec", self.netns, "ip6tables-nft-restore", stdin=filter_table(self.ports, family="ipv6"))
        self.intact = _sh("ip", "netns", "exec", self.netns, "iptables-nft-save")
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, timeout=60)

    @property
    def victim(self) -> str:
        return self.ports[0].port_id

    def delete_chain(self) -> None:
        short, tap = self.victim[:10], f"tap{self.victim[:11]}"
        kept = [ln for ln in self.intact.splitlines() if short not in ln and tap not in ln]
        _sh("ip", "netns", "exec", self.netns, "iptables-nft-restore", stdin="\n".join(kept) + "\n")

    def restore(self) -> None:
        _sh("ip", "netns", "exec", self.netns, "iptables-nft-restore", stdin=self.intact)


def scrape(port: int, name: str) -> list[float]:
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    return [s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name]


def wait_for(fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - not there yet
            last = e
        time.sleep(interval)
    raise TimeoutError(f"soak: timed out after {timeout:.0f} s waiting for {what}" + (f" ({last})" if last else ""))


class Soak:
    def __init__(self, workdir: Path, plan: Plan, echo: Callable[[str], None] = print) -> None:
        self.dir, self.plan, self.echo = workdir, plan, echo
        self.run_dir = workdir / "run"
        self.ports = LabPorts.free()
        self.iptables_port = free_port()
        self.kills: list[Kill] = []
        self.down: dict[str, list[tuple[float, float]]] = defaultdict(list)  # collector -> [(from, to)] wall
        self.cold_start_s: dict[str, float] = {}
        self.weights: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.procs: dict[str, ManagedProcess] = {}
        self.supervisor: Supervisor | None = None
        self.hv: Hypervisor | None = None
        self.stack: Stack | None = None

    # ------------------------------------------------------------------------------------- start
    def start(self) -> None:
        s = StackSettings(data_dir=self.dir / "stack", kafka_port=free_port(), kafka_controller_port=free_port(),
                          prometheus_port=free_port(), alertmanager_port=free_port(), scrape_targets=[])
        self.hv = Hypervisor(self.dir).__enter__()
        base = {"stack": {k: (str(v) if isinstance(v, Path) else v) for k, v in s.model_dump().items()},
                "stream": {"metrics_port": free_port(), "web_port": free_port(), "app_id": f"soak-{uuid.uuid4().hex[:6]}"},
                "collector": {"metrics_port": free_port(), "interval_s": self.plan.interval_s},
                "collectors": {"iptables": {"backend": "nft", "targets": [
                    {"host": self.hv.host, "netns": self.hv.netns, "ports_file": str(self.hv.ports_file)}]}}}
        base_file = self.dir / "base.yaml"
        base_file.write_text(yaml.safe_dump(base, sort_keys=False))
        self.settings, self.config = effective_config(base_file, self.run_dir, self.ports)
        self.doc = yaml.safe_load(self.config.read_text())
        self.stack = Stack(self.settings.stack, alertmanager_config=alertmanager_config(self.run_dir, self.ports),
                           with_prometheus=False)
        (self.run_dir / "bmcs" / "inventory.yaml").unlink(missing_ok=True)
        for comp in self.stack.components():
            self._timed_start(comp)
        procs = pipeline_processes(self.settings, self.config, self.run_dir, self.plan.traffic_rate, self.ports,
                                   bmcs=BMC_COUNT)
        procs.append(_opsloop("collector-iptables", self.run_dir, "collect", "iptables", "--config", str(self.config),
                              "--metrics-port", str(self.iptables_port), port=self.iptables_port))
        for p in procs:
            self._timed_start(p)
        # Kafka and Alertmanager are restarted by the schedule itself (down for outage_s), not by the supervisor.
        services = [p for n, p in self.procs.items() if n not in ("kafka", "alertmanager")]
        self.supervisor = Supervisor(services, max_restarts=50, window_s=600, backoff_s=0.5,
                                     max_backoff_s=5, echo=lambda m: self.echo(f"[supervisor] {m}"))
        self._spawn(self._supervise)
        self._spawn(self._sample_weights)

    def _timed_start(self, proc: ManagedProcess) -> None:
        t0 = time.monotonic()
        proc.start()
        self.cold_start_s[proc.name] = time.monotonic() - t0
        self.procs[proc.name] = proc

    def _spawn(self, fn: Callable[[], None]) -> None:
        t = threading.Thread(target=fn, daemon=True)
        t.start()
        self._threads.append(t)

    def _supervise(self) -> None:
        assert self.supervisor is not None
        while not self._stop.wait(0.25):
            try:
                self.supervisor.check()
            except StackError as e:
                self.echo(f"[supervisor] {e}")

    def _sample_weights(self) -> None:
        api = HaproxyAPI(self.run_dir / "lab" / "haproxy.sock", timeout_s=1.0)
        while not self._stop.wait(0.5):
            try:
                self.weights.append((time.time(), {s: api.get_weight("be_web", s)[0] for s in ("near", "far")}))
            except Exception:  # noqa: BLE001 - HAProxy busy or restarting: no sample
                pass

    # ------------------------------------------------------------------------------------- checks
    def _port(self, name: str) -> int:
        return {"stream-worker": self.settings.stream.metrics_port, "collector-haproxy": self.settings.collector.metrics_port,
                "collector-ipmi": self.ports.ipmi_metrics, "collector-iptables": self.iptables_port,
                "paging": self.ports.paging_metrics, "edge-control": self.ports.edge_metrics,
                "actuator": self.ports.actuator_metrics}[name]

    def _worker_batch_after(self, t: float) -> bool:
        return max(scrape(self._port("stream-worker"), "opsloop_stream_last_batch_timestamp_seconds"), default=0) > t

    def _round_after(self, name: str, t: float) -> bool:
        return max(scrape(self._port(name), "opsloop_collector_last_round_timestamp_seconds"), default=0) > t

    def _spools_empty(self) -> bool:
        return all(sum(scrape(self._port(c), "opsloop_spool_records")) == 0
                   for c in ("collector-haproxy", "collector-ipmi", "collector-iptables"))

    def _recovered(self, target: str, t: float) -> Callable[[], bool]:
        if target.startswith("collector-"):
            return lambda: self._round_after(target, t)
        if target == "stream-worker":
            return lambda: self._worker_batch_after(t)
        if target == "kafka":
            return lambda: self._worker_batch_after(t) and self._spools_empty()
        if target == "alertmanager":
            return lambda: self.procs["alertmanager"].ready()  # type: ignore[misc]
        return lambda: bool(scrape(self._port(target), "process_start_time_seconds"))

    def warm_up(self, timeout: float = 300) -> None:
        """Wait until data flows end to end: worker batches, every collector's round, weights applied."""
        t = time.time()
        wait_for(lambda: self._worker_batch_after(t), timeout, "the worker's first batch")
        for c in ("collector-haproxy", "collector-ipmi", "collector-iptables"):
            wait_for(lambda c=c: self._round_after(c, t), timeout, f"a round of {c}")
        wait_for(lambda: len(self.weights) > 4, timeout, "HAProxy weight samples")

    # ------------------------------------------------------------------------------------- schedule
    def kill(self, target: str, recover_timeout: float = 300) -> Kill:
        k = Kill(target, time.time())
        t0 = time.monotonic()
        proc = self.procs[target]
        if target in ("kafka", "alertmanager"):
            proc.stop()                     # the broker/Alertmanager restarted: down for outage_s
            time.sleep(self.plan.outage_s)
            assert self.stack is not None
            t0 = time.monotonic()           # its recovery counts from the restart, not from the outage
            self.procs[target] = self.stack.start_component(target)
        else:
            proc.kill()                     # SIGKILL to its process group; the supervisor restarts it
        self.echo(f"[soak] {'restarted' if target in ('kafka', 'alertmanager') else 'killed'} {target}")
        try:
            wait_for(self._recovered(target, k.at), recover_timeout, f"{target} to recover")
            k.recovered_s = time.monotonic() - t0
            self.echo(f"[soak] {target} recovered in {k.recovered_s:.1f} s")
        except TimeoutError as e:
            self.echo(f"[soak] {e}")
        if target.startswith("collector-"):
            self.down[target].append((k.at, time.time()))
        self.kills.append(k)
        return k

    def watts_file(self) -> Path:
        return self.run_dir / "bmcs" / "state" / POWER_VICTIM / "watts"

    def set_watts(self, watts: int) -> None:
        f = self.watts_file()
        tmp = f.with_suffix(".soak-tmp")
        tmp.write_text(f"{watts}\n")
        os.replace(tmp, f)

    def run_schedule(self, page_timeout: float = 400) -> None:
        """Kill each target in turn. Both problems open before the first kill, so the broker, worker, paging
        and Alertmanager kills all happen while they are open; each is repaired once it has paged (or after
        ``page_timeout``), two thirds into the schedule, so the resolve also crosses kills."""
        assert self.hv is not None
        targets = ["collector-ipmi", "collector-iptables", "kafka", "stream-worker", "paging", "alertmanager",
                   "edge-control", "actuator", "collector-haproxy"]
        steps = [t for _ in range(self.plan.cycles) for t in targets]
        repair_at = max(1, (2 * len(steps)) // 3)
        self.echo("[soak] inject: power jump, deleted chain")
        self.set_watts(JUMP_WATTS)
        self.hv.delete_chain()
        for i, target in enumerate(steps):
            if i == repair_at:
                self._wait_fired(page_timeout)
                self.echo("[soak] repair: power back, chain restored")
                self.set_watts(NORMAL_WATTS)
                self.hv.restore()
            self.kill(target)
            time.sleep(self.plan.gap_s)

    def _wait_fired(self, timeout: float) -> None:
        try:
            wait_for(lambda: all(c["firing"] >= 1 for c in self.count_pages()[0].values()), timeout,
                     "both problems to page", interval=1)
        except TimeoutError as e:
            self.echo(f"[soak] {e}")

    def wait_pages(self, timeout: float = 400) -> None:
        """Both problems paged and resolved (or the timeout; the result says which did not)."""
        try:
            wait_for(lambda: all(c["resolved"] >= 1 for c in self.count_pages()[0].values()), timeout,
                     "every problem's page and resolve", interval=2)
        except TimeoutError as e:
            self.echo(f"[soak] {e}")

    # ------------------------------------------------------------------------------------- results
    def count_pages(self) -> tuple[dict[str, dict[str, int]], list[str]]:
        assert self.hv is not None
        want = {p: dict(m) for p, m in PROBLEMS.items()}
        want["deleted chain"].update(hypervisor=self.hv.host, port=self.hv.victim)
        counts = {p: {"firing": 0, "resolved": 0} for p in want}
        other: list[str] = []
        path = self.run_dir / "pager" / "pages.jsonl"
        lines = path.read_bytes().splitlines() if path.exists() else []
        for line in lines:
            note = orjson.loads(line)["notification"]
            for status in ("firing", "resolved"):
                hit = {p for a in note.get("alerts", []) if a.get("status") == status
                       for p, m in want.items() if all(a["labels"].get(k) == v for k, v in m.items())}
                for p in hit:
                    counts[p][status] += 1
            other += [f"{a['status']} {a['labels'].get('alertname')} {a['labels'].get('host') or a['labels'].get('hypervisor', '')}"
                      for a in note.get("alerts", []) if not any(all(a["labels"].get(k) == v for k, v in m.items())
                                                                   for m in want.values())]
        return counts, sorted(set(other))

    def check_weights(self) -> list[str]:
        max_step = float(self.doc["controllers"]["actuator"].get("max_step", 0.5))
        bad, prev = [], None
        for t, w in self.weights:
            total = sum(w.values())
            if total == 0:
                bad.append(f"{time.strftime('%H:%M:%S', time.gmtime(t))} all zero {w}")
                prev = None
                continue
            shares = {s: v / total for s, v in w.items()}
            if prev is not None:
                step = max(abs(shares[s] - prev[s]) for s in shares)
                if step > max_step + 2 / 256:   # integer weights round each share by at most 1/256
                    bad.append(f"{time.strftime('%H:%M:%S', time.gmtime(t))} step {step:.3f} > {max_step} ({w})")
            prev = shares
        return bad

    def check_samples(self) -> tuple[dict[str, int], dict[str, int], int, int]:
        from kafka import KafkaAdminClient
        from tests.helpers import read_topic

        assert self.stack is not None
        boot = self.stack.kafka_bootstrap
        ends: dict[tuple[str, int], int] = {}
        records: list[Any] = []
        for topic in COLLECTOR_TOPICS:
            recs = read_topic(boot, topic, timeout_s=120)
            records += recs
            for r in recs:
                ends[(topic, r.partition)] = max(ends.get((topic, r.partition), 0), r.offset + 1)
        admin = KafkaAdminClient(bootstrap_servers=boot)
        group = self.settings.stream.app_id

        def committed() -> dict[tuple[str, int], int]:
            got = admin.list_group_offsets(group).get(group, {})
            return {(tp.topic, tp.partition): om.offset for tp, om in got.items()}

        try:   # the worker commits periodically: give it time to commit what it has processed
            wait_for(lambda: all(committed().get(k, -1) >= v for k, v in ends.items()), 120,
                     "the worker to commit every collector record", interval=1)
        except TimeoutError as e:
            self.echo(f"[soak] {e}")
        done = committed()
        admin.close()
        lost: dict[str, int] = defaultdict(int)
        times: dict[str, set[int]] = defaultdict(set)
        collector_of: dict[str, str] = {}
        samples = 0
        for r in records:
            doc = orjson.loads(r.value)
            for m in doc.get("metrics", [doc]) if isinstance(doc, dict) else []:
                key = m["name"] + "{" + ",".join(f"{k}={v}" for k, v in sorted(m.get("tags", {}).items())) + "}"
                samples += 1
                times[key].add(int(m["timestamp"]))
                collector_of[key] = {"telemetry.lb": "collector-haproxy", "telemetry.ipmi": "collector-ipmi",
                                     "telemetry.iptables": "collector-iptables"}[r.topic]
                if r.offset >= done.get((r.topic, r.partition), -1):
                    lost[key] += 1
        gaps: dict[str, int] = {}
        step = self.plan.interval_s
        for key, ts in times.items():
            missing = missing_rounds(sorted(ts), self.down.get(collector_of[key], []), step)
            if missing:
                gaps[key] = missing
        return dict(lost), gaps, len(times), samples

    def finish(self) -> SoakResult:
        pages, other = self.count_pages()
        lost, gaps, series, samples = self.check_samples()
        assert self.supervisor is not None
        return SoakResult(kills=self.kills, cold_start_s=self.cold_start_s, pages=pages, lost_in_worker=lost,
                          collector_gaps=gaps, series=series, samples=samples, weight_samples=len(self.weights),
                          unsafe_weights=self.check_weights(), restarts=len(self.supervisor.events), other_pages=other)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        for p in reversed(list(self.procs.values())):
            try:
                p.stop()
            except Exception as e:  # noqa: BLE001 - stop the rest regardless
                self.echo(f"[soak] stopping {p.name}: {e}")
        if self.hv is not None:
            self.hv.__exit__()


def soak(workdir: Path, plan: Plan, echo: Callable[[str], None] = print) -> SoakResult:
    s = Soak(workdir, plan, echo)
    try:
        s.start()
        echo("[soak] pipeline up; warming up")
        s.warm_up()
        s.run_schedule()
        s.wait_pages()
        res = s.finish()
    finally:
        s.stop()
    echo(res.table())
    return res


def run(quick: bool) -> list[dict[str, Any]]:
    import tempfile

    plan = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="opsloop-soak-") as tmp:
        res = soak(Path(tmp), plan, echo=lambda m: print(m, file=sys.stderr, flush=True))
    rec = res.recovery()
    cold = [res.cold_start_s[k.target] for k in res.kills if k.target in res.cold_start_s]
    cold_p50 = statistics.median(cold) if cold else float("nan")
    row = lambda metric, value, unit, target, ok, baseline="", bv="", ratio="": {  # noqa: E731
        "benchmark": "soak", "metric": metric, "value": value, "unit": unit, "baseline": baseline,
        "baseline_value": bv, "ratio": ratio, "target": target, "ok": ok}
    problems = res.problems_ok()
    return [
        row("kills (SIGKILL + broker/AM restarts)", len(res.kills), "count", "", None),
        row("recovery p50", round(pct(rec, 50), 2), "s", "", None, "cold start p50", round(cold_p50, 2),
            round(pct(rec, 50) / cold_p50, 2) if cold_p50 else ""),
        row("recovery p99", round(pct(rec, 99), 2), "s", "", None, "cold start p50", round(cold_p50, 2),
            round(pct(rec, 99) / cold_p50, 2) if cold_p50 else ""),
        row("kills not recovered", sum(k.recovered_s is None for k in res.kills), "count", "0",
            all(k.recovered_s is not None for k in res.kills)),
        row("samples lost collector->worker", res.lost, "samples", "0", res.lost == 0, "samples in Kafka", res.samples),
        row("problems paged exactly once + resolved", sum(problems.values()), "problems", str(len(problems)),
            all(problems.values())),
        row("unsafe weight samples", len(res.unsafe_weights), "samples", "0", not res.unsafe_weights,
            "weight samples", res.weight_samples),
    ]


if __name__ == "__main__":
    from bench.single import main

    raise SystemExit(main("bench.bench_soak", __doc__, run))
