"""`opsloop run`: the whole pipeline on this machine, with local real components (the `make run` job).

Starts, in order: the stack (Kafka KRaft, Alertmanager, Prometheus), the lab edge (HAProxy in front of
two toy origins, "near" with a capacity and "far" with more latency) and a light traffic generator,
then the stream worker and the HAProxy collector. Prints where to look, runs until Ctrl-C (or
`opsloop run --stop` / `make stop` from another shell), and stops every process by its PID.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

import yaml

from opsloop.config import DEFAULT_RUN_DIR, ConfigError, Settings, load_settings
from opsloop.lab.edge import EdgeSpec, OriginSpec, haproxy_process, origin_process
from opsloop.stack import ManagedProcess, Stack, StackError

EPILOG = """examples:
  opsloop run                       # default loopback ports; Ctrl-C stops everything
  opsloop run --config opsloop.yaml --traffic-rate 50
  opsloop run --stop                # from another shell (what `make stop` does)
"""

LAB_FRONTEND_PORT = 28080
LAB_ORIGINS = (OriginSpec("near", 28081, capacity=40, latency_ms=2), OriginSpec("far", 28082, latency_ms=30))


def _py(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def pipeline_processes(settings: Settings, config_path: Path, run_dir: Path, traffic_rate: float) -> list[ManagedProcess]:
    lab = run_dir / "lab"
    spec = EdgeSpec(lab, LAB_FRONTEND_PORT, list(LAB_ORIGINS))
    procs = [origin_process(o, lab) for o in spec.origins]
    procs.append(haproxy_process(spec))
    procs.append(ManagedProcess(
        name="traffic", workdir=run_dir / "traffic",
        argv=_py("opsloop.lab.traffic", "--url", f"http://127.0.0.1:{LAB_FRONTEND_PORT}/", "--rate", str(traffic_rate))))
    import requests

    def metrics_ready(port: int) -> bool:
        return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1).ok

    sp, cp = settings.stream.metrics_port, settings.collector.metrics_port
    procs.append(ManagedProcess(name="stream-worker", workdir=run_dir / "stream-worker",
                                argv=_py("opsloop.cli", "stream", "worker", "--config", str(config_path)),
                                ready=lambda: metrics_ready(sp), ready_timeout_s=90))
    procs.append(ManagedProcess(name="collector-haproxy", workdir=run_dir / "collector-haproxy",
                                argv=_py("opsloop.cli", "collect", "haproxy", "--config", str(config_path)),
                                ready=lambda: metrics_ready(cp), ready_timeout_s=60))
    return procs


def effective_config(base: Path | None, run_dir: Path) -> tuple[Settings, Path]:
    """The user's config (or defaults) plus the lab edge's admin socket, written where the processes read it."""
    doc: dict = yaml.safe_load(base.read_text()) if base else {}
    doc = doc or {}
    doc.setdefault("collectors", {}).setdefault("haproxy", {"instances": {"lab-edge": str(run_dir / "lab" / "haproxy.sock")}})
    doc.setdefault("collector", {}).setdefault("interval_s", 5.0)
    doc.setdefault("collector", {}).setdefault("spool_dir", str(run_dir / "spool"))
    doc.setdefault("stream", {}).setdefault("data_dir", str(run_dir / "streams"))
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "opsloop.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_settings(path), path


def stop_all(run_dir: Path, settings: Settings | None = None) -> None:
    names = ["collector-haproxy", "stream-worker", "traffic"]
    for n in names:
        ManagedProcess(name=n, argv=[], workdir=run_dir / n).stop()
    for n in ["haproxy", "origin-near", "origin-far"]:
        ManagedProcess(name=n, argv=[], workdir=run_dir / "lab").stop()
    Stack((settings or load_settings(None)).stack).down()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="opsloop run", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="opsloop YAML config (defaults otherwise)")
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR / "pipeline")
    p.add_argument("--traffic-rate", type=float, default=20.0, help="requests/s through the lab edge")
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
    stack = Stack(settings.stack)
    try:
        print("starting the stack (Kafka, Alertmanager, Prometheus) ...", flush=True)
        stack.up()
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
  /metrics       stream worker http://127.0.0.1:{s.stream.metrics_port}/metrics · collector http://127.0.0.1:{s.collector.metrics_port}/metrics
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
