"""`opsloop run`: the whole pipeline on this machine, with local real components (the `make run` job).

Starts, in order: the stack (Kafka KRaft, Alertmanager, Prometheus), the lab edge (HAProxy in front of
two toy origins, "near" with a capacity and "far" with more latency) and a light traffic generator,
then the stream worker and the HAProxy collector. Prints where to look, runs until Ctrl-C (or
`opsloop run --stop` / `make stop` from another shell), and stops every process by its PID.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import yaml

from opsloop.config import DEFAULT_RUN_DIR, REPO_ROOT, ConfigError, Settings, load_settings
from opsloop.lab.edge import EdgeSpec, OriginSpec, haproxy_process, origin_process
from opsloop.stack import ManagedProcess, Stack, StackError

EPILOG = """examples:
  opsloop run                       # default loopback ports; Ctrl-C stops everything
  opsloop run --config opsloop.yaml --traffic-rate 50
  opsloop run --stop                # from another shell (what `make stop` does)
"""

LAB_FRONTEND_PORT = 28080
LAB_ORIGINS = (OriginSpec("near", 28081, capacity=40, latency_ms=2), OriginSpec("far", 28082, latency_ms=30))
PAGER_PORT = 28090
IPMI_METRICS_PORT = 29102
PAGING_METRICS_PORT = 29103
ACTUATOR_METRICS_PORT = 29105
EDGE_METRICS_PORT = 29107
EDGE_API_PORT = 29108
SIMULATED_BMCS = 6


def _py(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def _metrics_ready(port: int) -> Callable[[], bool]:
    import requests

    return lambda: requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1).ok


def _opsloop(name: str, run_dir: Path, *args: str, port: int | None = None) -> ManagedProcess:
    return ManagedProcess(name=name, workdir=run_dir / name, argv=_py("opsloop.cli", *args),
                          ready=_metrics_ready(port) if port else None, ready_timeout_s=90)


def pipeline_processes(settings: Settings, config_path: Path, run_dir: Path, traffic_rate: float) -> list[ManagedProcess]:
    """Everything after the stack, in start order (the data flow, left to right)."""
    cfg = str(config_path)
    lab = run_dir / "lab"
    spec = EdgeSpec(lab, LAB_FRONTEND_PORT, list(LAB_ORIGINS))
    bmc_dir, inventory = run_dir / "bmcs", run_dir / "bmcs" / "inventory.yaml"
    inventory.unlink(missing_ok=True)
    procs = [origin_process(o, lab) for o in spec.origins]
    procs += [
        haproxy_process(spec),
        ManagedProcess(name="traffic", workdir=run_dir / "traffic",
                       argv=_py("opsloop.lab.traffic", "--url", f"http://127.0.0.1:{LAB_FRONTEND_PORT}/",
                                "--rate", str(traffic_rate))),
        ManagedProcess(name="bmcs", workdir=bmc_dir, ready=inventory.exists, ready_timeout_s=120,
                       argv=_py("collectors.ipmi.bmcsim", "--count", str(SIMULATED_BMCS), "--dir", str(bmc_dir / "state"),
                                "--inventory", str(inventory))),
        ManagedProcess(name="pager", workdir=run_dir / "pager",
                       argv=_py("opsloop.lab.pager", "--port", str(PAGER_PORT), "--out", str(run_dir / "pager" / "pages.jsonl"))),
        _opsloop("stream-worker", run_dir, "stream", "worker", "--config", cfg, port=settings.stream.metrics_port),
        _opsloop("collector-haproxy", run_dir, "collect", "haproxy", "--config", cfg, port=settings.collector.metrics_port),
        _opsloop("collector-ipmi", run_dir, "collect", "ipmi", "--config", cfg, "--metrics-port", str(IPMI_METRICS_PORT),
                 port=IPMI_METRICS_PORT),
        _opsloop("paging", run_dir, "page", "run", "--config", cfg, "--metrics-port", str(PAGING_METRICS_PORT),
                 "--state-file", str(run_dir / "paging" / "state.json"), port=PAGING_METRICS_PORT),
        _opsloop("edge-control", run_dir, "edge", "run", "--config", cfg, port=EDGE_METRICS_PORT),
        _opsloop("actuator", run_dir, "weights", "run", "--config", cfg, port=ACTUATOR_METRICS_PORT),
    ]
    return procs


PROCESS_NAMES = ("actuator", "edge-control", "paging", "collector-ipmi", "collector-haproxy", "stream-worker", "pager", "bmcs", "traffic")
LAB_PROCESS_NAMES = ("haproxy", "origin-near", "origin-far")
SCRAPE_TARGETS = {"collector-ipmi": IPMI_METRICS_PORT, "paging": PAGING_METRICS_PORT,
                  "edge-control": EDGE_METRICS_PORT, "actuator": ACTUATOR_METRICS_PORT}


def effective_config(base: Path | None, run_dir: Path) -> tuple[Settings, Path]:
    """The user's config (or defaults) plus the lab's addresses, written where the processes read it."""
    doc: dict = (yaml.safe_load(base.read_text()) if base else {}) or {}
    collectors = doc.setdefault("collectors", {})
    collectors.setdefault("haproxy", {"instances": {"lab-edge": str(run_dir / "lab" / "haproxy.sock")}})
    collectors.setdefault("ipmi", {"inventory": str(run_dir / "bmcs" / "inventory.yaml"), "timeout_s": 6})
    doc.setdefault("collector", {}).setdefault("interval_s", 5.0)
    doc["collector"].setdefault("spool_dir", str(run_dir / "spool"))
    doc.setdefault("stream", {}).setdefault("data_dir", str(run_dir / "streams"))
    stack = doc.get("stack", {})
    am = f"http://127.0.0.1:{stack.get('alertmanager_port', 29094)}"
    controllers = doc.setdefault("controllers", {})
    controllers.setdefault("paging", {"alertmanager_urls": [am]})
    run_dir.mkdir(parents=True, exist_ok=True)
    # The closed loop over the lab edge: controller (topology = the lab) and the HAProxy actuator.
    token = run_dir / "edge-api.token"
    if not token.exists():
        token.write_text(secrets.token_urlsafe(24) + "\n")
        token.chmod(0o600)
    controllers.setdefault("edge", {
        "interval_s": 5.0, "topology_file": str(REPO_ROOT / "controllers" / "edge" / "topology.yaml"),
        "metrics_port": EDGE_METRICS_PORT, "api": {"port": EDGE_API_PORT, "token_file": str(token)}})
    controllers.setdefault("actuator", {
        "mode": "live", "stale_after_s": 30, "store_dir": str(run_dir / "actuator" / "store"),
        "metrics_port": ACTUATOR_METRICS_PORT,
        "targets": [{"kind": "haproxy", "edge": "lab-edge", "listener": "web",
                     "socket": str(run_dir / "lab" / "haproxy.sock"), "backend": "be_web",
                     "servers": {"near": "near", "far": "far"}}]})
    path = run_dir / "opsloop.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_settings(path), path


def alertmanager_config(run_dir: Path) -> Path:
    """alerts/alertmanager.yml with every receiver pointed at the lab pager (a dummy PagerDuty key)."""
    from controllers.paging.amconfig import write_alertmanager_config

    key = run_dir / "pager" / "pagerduty-routing-key"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("lab-routing-key\n")
    key.chmod(0o600)
    return write_alertmanager_config(run_dir / "pager" / "alertmanager.yml",
                                     webhook_url=f"http://127.0.0.1:{PAGER_PORT}", routing_key_file=key,
                                     timings={"group_wait": "5s", "group_interval": "30s", "repeat_interval": "1h"})


def stop_all(run_dir: Path, settings: Settings | None = None) -> None:
    for n in PROCESS_NAMES:
        ManagedProcess(name=n, argv=[], workdir=run_dir / n).stop()
    for n in LAB_PROCESS_NAMES:
        ManagedProcess(name=n, argv=[], workdir=run_dir / "lab").stop()
    Stack((settings or load_settings(None)).stack).down()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="opsloop run", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="opsloop YAML config (defaults otherwise)")
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR / "pipeline")
    p.add_argument("--traffic-rate", type=float, default=60.0, help="requests/s through the lab edge")
    p.add_argument("--stop", action="store_true", help="stop a pipeline started by another `opsloop run`")
    p.add_argument("--duration", type=float, default=0, help="run this many seconds, then stop (0 = until Ctrl-C)")
    a = p.parse_args(argv)
    try:
        settings, config_path = effective_config(a.config, a.run_dir)
    except ConfigError as e:
        print(f"opsloop run: {e}", file=sys.stderr)
        return 2
    if a.stop:
        stop_all(a.run_dir, settings)
        print("pipeline stopped")
        return 0
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stack = Stack(settings.stack, alertmanager_config=alertmanager_config(a.run_dir))
    try:
        print("starting the stack (Kafka, Alertmanager, Prometheus) ...", flush=True)
        stack.up()
        for name, port in SCRAPE_TARGETS.items():
            stack.add_scrape_target(name, f"127.0.0.1:{port}")
        for proc in pipeline_processes(settings, config_path, a.run_dir, a.traffic_rate):
            print(f"starting {proc.name} ...", flush=True)
            proc.start()
    except StackError as e:
        print(f"opsloop run: {e}", file=sys.stderr)
        stop_all(a.run_dir, settings)
        return 1
    s = settings
    print(f"""
opsloop is running.
  Prometheus     {stack.prometheus_url}/graph?g0.expr=opsloop_lb_server_request_rate
  Alertmanager   {stack.alertmanager_url}
  Kafka          {stack.kafka_bootstrap}   (topics telemetry.*, findings, edge.weights, telemetry.deadletter)
  lab edge       http://127.0.0.1:{LAB_FRONTEND_PORT}/  (HAProxy; origins near :28081, far :28082)
  /metrics       stream worker :{s.stream.metrics_port} · haproxy collector :{s.collector.metrics_port} · ipmi collector :{IPMI_METRICS_PORT} · paging :{PAGING_METRICS_PORT}
  BMCs           {SIMULATED_BMCS} simulated BMCs (ipmi_sim); set one's power: write watts to {a.run_dir}/bmcs/state/<host>/watts
  edge loop      controller :{EDGE_METRICS_PORT} (API :{EDGE_API_PORT}, token in {a.run_dir}/edge-api.token) · actuator :{ACTUATOR_METRICS_PORT}
                 weights: opsloop weights show --config {a.run_dir}/opsloop.yaml --edge lab-edge
  pages          {a.run_dir}/pager/pages.jsonl (Alertmanager → lab pager on :{PAGER_PORT})
  logs           {a.run_dir}/*/ and {s.stack.data_dir}/*/
Ctrl-C (or `make stop` in another shell) stops everything.
""", flush=True)
    deadline = time.monotonic() + a.duration if a.duration else None
    while not stop.wait(1.0):
        if deadline and time.monotonic() > deadline:
            break
    print("stopping ...", flush=True)
    stop_all(a.run_dir, settings)
    print("stopped", flush=True)
    return 0
