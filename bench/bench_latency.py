"""End-to-end paging latency and the services' memory.

Signal: a VM's security-group chain deleted in a network namespace (a "hypervisor"), read by the real
iptables collector (1 s rounds). Two paths from the same sample to the same Alertmanager and webhook:

* ours:  collector → Kafka → stream worker (firewall detector) → ``findings`` → paging actuator →
         Alertmanager → webhook;
* rule:  the worker's ``opsloop_firewall_ports{state="unprotected"}`` gauge → Prometheus (1 s scrape and
         evaluation, ``... > 0`` with ``for: 0s``) → Alertmanager → webhook.

Latency = webhook receipt − the sample's event timestamp (set by the collector round; the finding carries
it as ``first_seen``), for both paths. Alertmanager runs our alertmanager.yml with group_wait 1 s on both
paths (production: 10 s for critical), so the difference is the pipeline, not Alertmanager's batching.
Each trial breaks a different hypervisor (a new alert group), then restores it.

Memory: peak RSS (``VmHWM``) of the worker, the collector and the paging actuator at the end of the run,
next to their RSS once started and idle. After the latency trials a load phase runs: the stream
benchmark's LB telemetry (bench_stream's records) through the worker and a burst of warning
findings (opened, then cleared) through the paging actuator; the collector reads every hypervisor each
second throughout.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import requests
import yaml

from opsloop.collectors.iptables.neutron_layout import LayoutPort, filter_table
from opsloop.controllers.paging.amconfig import write_alertmanager_config, write_private
from opsloop.config import StackSettings
from opsloop.stack import ManagedProcess, Stack, free_port
from bench.bench_stream import _produce, _records
from opsloop.records import Finding, Severity
from opsloop.stack.components import alertmanager, prometheus
from opsloop.topics import Topic

REPO = Path(__file__).resolve().parent.parent
RULE_ALERT = "BenchFirewallUnprotectedRule"
OURS_ALERT = "FirewallUnprotectedPort"
TARGET_P99_S = 2.0


# ------------------------------------------------------------------------------------ helpers
class Webhook:
    """Records (path, alert, receipt time) of every firing alert Alertmanager posts."""

    def __init__(self) -> None:
        self.port = free_port()
        self.lock = threading.Lock()
        self.alerts: list[tuple[str, dict[str, Any], float]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                received = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = {}
                with hook.lock:
                    for a in doc.get("alerts", []) if isinstance(doc, dict) else []:
                        if a.get("status") == "firing":
                            hook.alerts.append((self.path, a, received))
                self.send_response(202)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def first(self, alertname: str, hypervisor: str) -> tuple[dict[str, Any], float] | None:
        with self.lock:
            for _, a, t in self.alerts:
                if a["labels"].get("alertname") == alertname and a["labels"].get("hypervisor") == hypervisor:
                    return a, t
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _sh(*argv: str, stdin: str | None = None) -> str:
    res = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise RuntimeError(f"{argv} failed: {res.stderr.strip()}")
    return res.stdout


class Hypervisor:
    """A network namespace with two tap devices and Neutron's iptables layout (nft backend)."""

    def __init__(self, tmp: Path, host: str) -> None:
        self.host = host
        self.netns = f"opsl-bl-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        _sh("ip", "netns", "add", self.netns)
        self.ports = [LayoutPort(str(uuid.uuid4()), f"10.8.0.{i + 10}", f"fa:16:3e:08:00:{i:02x}") for i in range(2)]
        for p in self.ports:
            _sh("ip", "netns", "exec", self.netns, "ip", "tuntap", "add", "dev", f"tap{p.port_id[:11]}", "mode", "tap")
        self.ports_file = tmp / f"{host}-ports.json"
        self.ports_file.write_text(json.dumps([{"port_id": p.port_id, "vm": f"vm{i}"} for i, p in enumerate(self.ports)]))
        self.intact = filter_table(self.ports)
        self.restore()
        _sh("ip", "netns", "exec", self.netns, "ip6tables-nft-restore", stdin=filter_table(self.ports, family="ipv6"))

    def restore(self, text: str | None = None) -> None:
        _sh("ip", "netns", "exec", self.netns, "iptables-nft-restore", stdin=text or self.intact)

    def break_chain(self) -> None:
        """The incident: one VM's security-group chains and every rule naming them are gone."""
        victim = self.ports[0].port_id
        saved = _sh("ip", "netns", "exec", self.netns, "iptables-nft-save")
        kept = [ln for ln in saved.splitlines() if victim[:10] not in ln and f"tap{victim[:11]}" not in ln]
        self.restore("\n".join(kept) + "\n")

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, timeout=30)


def _wait(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = fn()
        except (requests.RequestException, OSError):
            v = None
        if v:
            return v
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def _metrics_up(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1).ok
    except requests.RequestException:
        return False


def _opsloop(name: str, tmp: Path, args: list[str], port: int) -> ManagedProcess:
    proc = ManagedProcess(name=name, workdir=tmp / name, ready_timeout_s=90, argv=[sys.executable, *args],
                          env={"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
                          ready=lambda: _metrics_up(port))
    proc.start()
    return proc


def _status_kib(proc: ManagedProcess, field: str) -> float:
    pid = proc.read_pid()[0]  # type: ignore[index]
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    return 0.0


def _percentile(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _metric_sum(port: int, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def _load(bootstrap: str, worker_port: int, paging_port: int, n_records: int, n_findings: int) -> None:
    """The stream benchmark's telemetry through the worker, a burst of findings (opened, cleared) through the actuator."""
    samples_before = _metric_sum(worker_port, "opsloop_stream_samples_total")
    consumed_before = _metric_sum(paging_port, "opsloop_paging_findings_total")
    _produce(bootstrap, Topic.LB.value, _records(n_records, time.time() - 3600))
    now = time.time()
    opened = [Finding(detector="power.generation_deviation", what="bench load", where={"host": f"load-{i}"},
                      observed=1.0, expected=0.0, severity=Severity.WARNING, explanation="bench load",
                      first_seen=now, last_seen=now) for i in range(n_findings)]
    cleared = [f.model_copy(update={"cleared": True}) for f in opened]
    _produce(bootstrap, Topic.FINDINGS.value, [(f.id.encode(), f.encode()) for f in opened + cleared])
    _wait(lambda: _metric_sum(worker_port, "opsloop_stream_samples_total") - samples_before
          >= n_records * 50, 300, "load through the worker")
    _wait(lambda: _metric_sum(paging_port, "opsloop_paging_findings_total") - consumed_before
          >= 2 * n_findings, 300, "findings through the actuator")


def _first_seen(alert: dict[str, Any]) -> float:
    return datetime.fromisoformat(alert["annotations"]["first_seen"].replace("Z", "+00:00")).timestamp()


# -------------------------------------------------------------------------------------- bench
def _measure(tmp: Path, trials: int) -> tuple[list[float], list[float], dict[str, tuple[float, float]], int]:
    stack = Stack(StackSettings(data_dir=tmp / "stack", kafka_port=free_port(), kafka_controller_port=free_port(),
                                prometheus_port=free_port(), alertmanager_port=free_port(), scrape_interval_s=1.0,
                                scrape_targets=[]))
    hook = Webhook()
    procs: list[ManagedProcess] = []
    hvs: list[Hypervisor] = []
    try:
        stack.start_component("kafka")
        hvs = [Hypervisor(tmp, f"bench-hv{i:02d}") for i in range(trials)]
        key = tmp / "routing-key"
        write_private(key, "bench-routing-key")   # a routing key is a secret: 0600 from creation
        am_cfg = write_alertmanager_config(tmp / "am" / "alertmanager.yml", webhook_url=f"http://127.0.0.1:{hook.port}",
                                           routing_key_file=key, timings={"group_wait": "1s", "group_interval": "2s",
                                                                          "repeat_interval": "1h"})
        am_port = free_port()
        am = alertmanager(tmp / "am", "127.0.0.1", am_port, config=am_cfg)
        am.start()
        procs.append(am)

        worker_port, collector_port, paging_port = free_port(), free_port(), free_port()
        config = tmp / "opsloop.yaml"
        config.write_text(yaml.safe_dump({
            "kafka": {"bootstrap_servers": stack.kafka_bootstrap},
            "stream": {"app_id": f"bench-latency-{uuid.uuid4().hex[:6]}", "data_dir": str(tmp / "streams"),
                       "metrics_port": worker_port, "web_port": free_port()},
            "collector": {"interval_s": 1.0, "spool_dir": str(tmp / "spool"), "metrics_port": collector_port},
            "collectors": {"iptables": {"backend": "nft", "targets": [
                {"host": hv.host, "netns": hv.netns, "ports_file": str(hv.ports_file)} for hv in hvs]}},
            "controllers": {"paging": {"alertmanager_urls": [f"http://127.0.0.1:{am_port}"],
                                       "group_id": f"bench-paging-{uuid.uuid4().hex[:6]}", "metrics_port": paging_port,
                                       "state_file": str(tmp / "paging" / "state.json")}},
        }))
        rules = tmp / "bench-rules.yml"
        rules.write_text(yaml.safe_dump({"groups": [{"name": "bench", "rules": [{
            "alert": RULE_ALERT, "expr": 'opsloop_firewall_ports{state="unprotected"} > 0', "for": "0s",
            "labels": {"severity": "critical", "signal": "firewall-rule"},
            "annotations": {"summary": "unprotected VM ports on {{ $labels.hypervisor }}"}}]}]}))
        prom = prometheus(tmp / "prom", "127.0.0.1", free_port(), [f"127.0.0.1:{worker_port}"], 1.0,
                          f"127.0.0.1:{am_port}", rule_files=[rules])
        prom.start()
        procs.append(prom)
        services = {
            "paging actuator": _opsloop("paging", tmp, ["-m", "opsloop.controllers.paging.cli", "run", "--config", str(config)],
                                        paging_port),
            "stream worker": _opsloop("worker", tmp, ["-m", "opsloop.cli", "stream", "worker", "--config", str(config)],
                                      worker_port),
            "collector (iptables)": _opsloop("collector", tmp, ["-m", "opsloop.cli", "collect", "iptables", "--config",
                                                                str(config)], collector_port),
        }
        procs.extend(services.values())
        # Warm: every hypervisor's round reached the worker and Prometheus has the series.
        _wait(lambda: all(f'hypervisor="{hv.host}"' in requests.get(f"http://127.0.0.1:{worker_port}/metrics",
                                                                        timeout=2).text for hv in hvs),
              120, "every hypervisor in the worker")
        idle = {name: _status_kib(p, "VmRSS") for name, p in services.items()}

        ours: list[float] = []
        rule: list[float] = []
        failed = 0
        for hv in hvs:
            hv.break_chain()
            try:
                a_ours, t_ours = _wait(lambda: hook.first(OURS_ALERT, hv.host), 60, "our page")
                a_rule, t_rule = _wait(lambda: hook.first(RULE_ALERT, hv.host), 60, "rule page")
            except TimeoutError:
                failed += 1
                hv.restore()
                continue
            sample_ts = _first_seen(a_ours)
            ours.append(t_ours - sample_ts)
            rule.append(t_rule - sample_ts)
            hv.restore()
            time.sleep(1.0)   # let the restore's round pass before the next break
        _load(stack.kafka_bootstrap, worker_port, paging_port, n_records=trials * 100, n_findings=trials * 50)
        peak = {name: (_status_kib(p, "VmHWM"), idle[name]) for name, p in services.items()}
        return ours, rule, peak, failed
    finally:
        for p in reversed(procs):
            p.stop()
        for hv in hvs:
            hv.delete()
        stack.down()
        hook.close()


def run(quick: bool = False) -> list[dict[str, Any]]:
    trials = 6 if quick else 20
    tmp = Path(tempfile.mkdtemp(prefix="opsloop-bench-latency-"))
    try:
        ours, rule, peak, failed = _measure(tmp, trials)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not ours:
        raise RuntimeError(f"no trial paged on both paths ({failed} of {trials} timed out)")
    rows: list[dict[str, Any]] = []
    for q in (50, 99):
        v, b = _percentile(ours, q), _percentile(rule, q)
        rows.append({"benchmark": "sample -> page (firewall chain deleted)", "metric": f"p{q} latency, opsloop path "
                     f"({len(ours)} trials, {failed} timed out)", "value": round(v, 3),
                     "baseline": f"p{q} Prometheus-rule path (1 s scrape+eval), same samples",
                     "baseline_value": round(b, 3), "ratio": round(v / b, 3) if b else float("nan"), "unit": "s",
                     "target": f"p99 <= {TARGET_P99_S} s" if q == 99 else "", "ok": v <= TARGET_P99_S if q == 99 else None})
    for name, (hwm, idle_kib) in peak.items():
        rows.append({"benchmark": f"{name} memory", "metric": "peak RSS (VmHWM): latency run + load phase",
                     "value": round(hwm / 1024, 1), "baseline": "RSS once started (idle)",
                     "baseline_value": round(idle_kib / 1024, 1), "ratio": round(hwm / idle_kib, 3) if idle_kib else 0.0,
                     "unit": "MiB", "target": "", "ok": None})
    return rows


if __name__ == "__main__":
    from bench.single import main

    raise SystemExit(main("bench.bench_latency", __doc__, run))
