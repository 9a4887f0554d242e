"""`opsloop run`: the whole pipeline on this machine, with local real components (the `make run` job).

Starts the stack (Kafka KRaft, Alertmanager, Prometheus), the lab edge (HAProxy in front of two toy
origins, "near" with a capacity and "far" with more latency) and a light traffic generator, then the
stream worker, the collectors, paging and the edge loop (every process is listed below). Prints
where to look and runs until Ctrl-C (or `opsloop run --stop` / `make stop` from another shell, which
ends this process too), and stops every process by its PID. While it runs it supervises its
children: one that dies is restarted with back-off (at most --max-restarts restarts of one child
within --restart-window; then everything stops, naming it).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Callable

import yaml

from opsloop.argtypes import finite, integer
from opsloop.config import DEFAULT_RUN_DIR, REPO_ROOT, ConfigError, Settings, load_settings, read_document
from opsloop.controllers.edge.service.token_file import create_token_file
from opsloop.controllers.paging.amconfig import write_alertmanager_config
from opsloop.lab.edge import EdgeSpec, OriginSpec, haproxy_process, origin_process
from opsloop.log import setup_logging
from opsloop.paths import write_private
from opsloop.stack import ManagedProcess, Stack, StackError, free_port
from opsloop.stack.process import pid_alive, write_pidfile
from opsloop.stack.supervisor import RestartBudgetExceeded, Supervisor

EPILOG = """examples:
  opsloop run                       # default loopback ports; Ctrl-C stops everything
  opsloop run --config opsloop.yaml --traffic-rate 50
  opsloop run --stop                # from another shell (what `make stop` does); ends `opsloop run` too
  opsloop run --max-restarts 3 --restart-window 60   # a tighter restart budget per child
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


@dataclass(frozen=True)
class LabPorts:
    """The loopback ports of the lab and of the services the config does not place (the defaults: make run)."""

    frontend: int = LAB_FRONTEND_PORT
    near: int = LAB_ORIGINS[0].port
    far: int = LAB_ORIGINS[1].port
    pager: int = PAGER_PORT
    ipmi_metrics: int = IPMI_METRICS_PORT
    paging_metrics: int = PAGING_METRICS_PORT
    actuator_metrics: int = ACTUATOR_METRICS_PORT
    edge_metrics: int = EDGE_METRICS_PORT
    edge_api: int = EDGE_API_PORT

    @classmethod
    def free(cls) -> "LabPorts":
        """Free ports for every field (tests and the soak, next to a running `make run`)."""
        return cls(**{f: free_port() for f in cls.__dataclass_fields__})

    def origins(self) -> list[OriginSpec]:
        near, far = LAB_ORIGINS
        return [OriginSpec(near.name, self.near, capacity=near.capacity, latency_ms=near.latency_ms),
                OriginSpec(far.name, self.far, capacity=far.capacity, latency_ms=far.latency_ms)]


def _py(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def _metrics_ready(port: int) -> Callable[[], bool]:
    import requests

    return lambda: requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1).ok


def _opsloop(name: str, run_dir: Path, *args: str, port: int | None = None) -> ManagedProcess:
    return ManagedProcess(name=name, workdir=run_dir / name, argv=_py("opsloop.cli", *args),
                          ready=_metrics_ready(port) if port else None, ready_timeout_s=90)


def pipeline_processes(settings: Settings, config_path: Path, run_dir: Path, traffic_rate: float,
                       ports: LabPorts = LabPorts(), bmcs: int = SIMULATED_BMCS) -> list[ManagedProcess]:
    """Everything after the stack, in start order (the data flow, left to right). Building the list has no
    side effects, so `opsloop run --stop` derives what to stop from it."""
    cfg = str(config_path)
    lab = run_dir / "lab"
    spec = EdgeSpec(lab, ports.frontend, ports.origins())
    bmc_dir, inventory = run_dir / "bmcs", run_dir / "bmcs" / "inventory.yaml"
    procs = [origin_process(o, lab) for o in spec.origins]
    procs += [
        haproxy_process(spec),
        ManagedProcess(name="traffic", workdir=run_dir / "traffic",
                       argv=_py("opsloop.lab.traffic", "--url", f"http://127.0.0.1:{ports.frontend}/",
                                "--rate", str(traffic_rate))),
        ManagedProcess(name="bmcs", workdir=bmc_dir, ready=inventory.exists, ready_timeout_s=120,
                       argv=_py("opsloop.lab.bmcsim", "--count", str(bmcs), "--dir", str(bmc_dir / "state"),
                                "--inventory", str(inventory))),
        ManagedProcess(name="pager", workdir=run_dir / "pager",
                       argv=_py("opsloop.lab.pager", "--port", str(ports.pager), "--out", str(run_dir / "pager" / "pages.jsonl"))),
        _opsloop("stream-worker", run_dir, "stream", "worker", "--config", cfg, port=settings.stream.metrics_port),
        _opsloop("collector-haproxy", run_dir, "collect", "haproxy", "--config", cfg, port=settings.collector.metrics_port),
        _opsloop("collector-ipmi", run_dir, "collect", "ipmi", "--config", cfg, "--metrics-port", str(ports.ipmi_metrics),
                 port=ports.ipmi_metrics),
        _opsloop("paging", run_dir, "page", "run", "--config", cfg, "--metrics-port", str(ports.paging_metrics),
                 "--state-file", str(run_dir / "paging" / "state.json"), port=ports.paging_metrics),
        _opsloop("edge-control", run_dir, "edge", "run", "--config", cfg, port=ports.edge_metrics),
        _opsloop("actuator", run_dir, "weights", "run", "--config", cfg, port=ports.actuator_metrics),
    ]
    return procs


def scrape_targets(ports: LabPorts = LabPorts()) -> dict[str, int]:
    """Services whose /metrics port the config does not name (Prometheus learns them at start)."""
    return {"collector-ipmi": ports.ipmi_metrics, "paging": ports.paging_metrics,
            "edge-control": ports.edge_metrics, "actuator": ports.actuator_metrics}


# The general anomaly detector on the lab's BMC watts: warm after 12 samples (a minute at the lab's 5 s
# interval), so writing 600 to a BMC's watts file opens an anomaly finding and pages within about a minute;
# the finding resolves three samples after the draw is back in its band. Novelty damping is off: the demo
# repeats the same jump, and a level seen before must page again here.
LAB_ANOMALY = {"series": [{"metric": "ipmi_power", "field": "watts"}], "clear_after": 3,
               "detector": {"warmup_points": 12, "novelty_p": 1.0}}


def effective_config(base: Path | None, run_dir: Path, ports: LabPorts = LabPorts()) -> tuple[Settings, Path]:
    """The user's config (or defaults) plus the lab's addresses, written where the processes read it."""
    # The shared reader: a missing, non-UTF-8, non-YAML or non-mapping file is one ConfigError line
    # naming the file (yaml.safe_load here was a traceback and exit 1).
    doc: dict = read_document(base) if base else {}
    collectors = doc.setdefault("collectors", {})
    collectors.setdefault("haproxy", {"instances": {"lab-edge": str(run_dir / "lab" / "haproxy.sock")}})
    collectors.setdefault("ipmi", {"inventory": str(run_dir / "bmcs" / "inventory.yaml"), "timeout_s": 6})
    doc.setdefault("collector", {}).setdefault("interval_s", 5.0)
    doc["collector"].setdefault("spool_dir", str(run_dir / "spool"))
    doc.setdefault("stream", {}).setdefault("data_dir", str(run_dir / "streams"))
    stack = doc.get("stack", {})
    am = f"http://127.0.0.1:{stack.get('alertmanager_port', 29094)}"
    if "kafka_port" in stack:  # the services talk to the broker this run starts
        doc.setdefault("kafka", {}).setdefault("bootstrap_servers", f"127.0.0.1:{stack['kafka_port']}")
    controllers = doc.setdefault("controllers", {})
    controllers.setdefault("paging", {"alertmanager_urls": [am]})
    if "detectors" not in controllers:   # (the old place of the section wins if the user's config uses it)
        doc.setdefault("streams", {}).setdefault("detectors", {}).setdefault("anomaly", LAB_ANOMALY)
    run_dir.mkdir(parents=True, exist_ok=True)
    # The closed loop over the lab edge: controller (topology = the lab) and the HAProxy actuator.
    token = run_dir / "edge-api.token"
    if not token.exists():
        create_token_file(token)  # 0600 from creation
    controllers.setdefault("edge", {
        "interval_s": 5.0, "topology_file": str(REPO_ROOT / "controllers" / "edge" / "topology.yaml"),
        "metrics_port": ports.edge_metrics, "api": {"port": ports.edge_api, "token_file": str(token)}})
    controllers.setdefault("actuator", {
        "mode": "live", "stale_after_s": 30, "store_dir": str(run_dir / "actuator" / "store"),
        "metrics_port": ports.actuator_metrics,
        "targets": [{"kind": "haproxy", "edge": "lab-edge", "listener": "web",
                     "socket": str(run_dir / "lab" / "haproxy.sock"), "backend": "be_web",
                     "servers": {"near": "near", "far": "far"}}]})
    path = run_dir / "opsloop.yaml"
    # The user's settings may hold secrets (Alertmanager user:password@, Kafka password): 0600 from creation.
    write_private(path, yaml.safe_dump(doc, sort_keys=False))
    return load_settings(path), path


def alertmanager_config(run_dir: Path, ports: LabPorts = LabPorts()) -> Path:
    """alerts/alertmanager.yml with every receiver pointed at the lab pager (a dummy PagerDuty key)."""
    key = run_dir / "pager" / "pagerduty-routing-key"
    key.parent.mkdir(parents=True, exist_ok=True)
    write_private(key, "lab-routing-key\n")   # 0600 from creation: no window where others may read it
    return write_alertmanager_config(run_dir / "pager" / "alertmanager.yml",
                                     webhook_url=f"http://127.0.0.1:{ports.pager}", routing_key_file=key,
                                     timings={"group_wait": "5s", "group_interval": "30s", "repeat_interval": "1h"})


def stop_all(run_dir: Path, settings: Settings, config_path: Path, ports: LabPorts = LabPorts()) -> None:
    """Stop every pipeline process (the list `opsloop run` starts, in reverse), then the stack."""
    for proc in reversed(pipeline_processes(settings, config_path, run_dir, 0.0, ports)):
        proc.stop()
    Stack(settings.stack).down()


def run_pidfile(run_dir: Path) -> ManagedProcess:
    """The handle on a running `opsloop run` itself: `opsloop run --stop` signals it by this pidfile."""
    return ManagedProcess(name="opsloop-run", argv=[], workdir=run_dir)


def stop_running(run_dir: Path, settings: Settings, config_path: Path, timeout_s: float = 180.0) -> None:
    """End a running `opsloop run` (it stops its children and exits), then stop whatever is left by PID."""
    rec = run_pidfile(run_dir).read_pid()
    if rec is not None and pid_alive(*rec) and rec[0] != os.getpid():
        print(f"asking opsloop run (pid {rec[0]}) to stop ...", flush=True)
        os.kill(rec[0], signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(*rec) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(*rec):  # killed, or its supervisor would restart what we stop next
            print(f"opsloop run (pid {rec[0]}) still running after {timeout_s:.0f} s; killing it and stopping "
                  "its children", file=sys.stderr, flush=True)
            os.kill(rec[0], signal.SIGKILL)
    stop_all(run_dir, settings, config_path)
    run_pidfile(run_dir).pidfile.unlink(missing_ok=True)


def started_process_names() -> list[str]:
    """What `opsloop run` starts, in order: the stack's components, then :func:`pipeline_processes`
    (built with the default settings in a scratch directory, so nothing of a real run is touched)."""
    settings = Settings()
    with tempfile.TemporaryDirectory(prefix="opsloop-run-help-") as tmp:
        procs = pipeline_processes(settings, Path(tmp) / "opsloop.yaml", Path(tmp), 0.0)
    return Stack(settings.stack).component_names() + [proc.name for proc in procs]


def run_description() -> str:
    """The help's description: what the module says, then the processes, counted from the code's lists."""
    try:
        names = started_process_names()
    except StackError as e:  # e.g. haproxy not installed yet: say so instead of failing --help
        listing = f"The list of processes needs the lab's binaries: {e}"
    else:
        listing = (f"It starts {len(names)} processes, in this order: "
                   + ", ".join(names) + ".")
    return f"{__doc__}\n{textwrap.fill(listing, width=100, break_on_hyphens=False)}\n"


class _RunParser(argparse.ArgumentParser):
    """Derives the process list only when help is shown (it builds the process handles)."""

    def format_help(self) -> str:
        self.description = run_description()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    p = _RunParser(prog="opsloop run", description=__doc__, epilog=EPILOG,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="opsloop YAML config (defaults otherwise)")
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR / "pipeline",
                   help="where the processes keep their files and logs (default %(default)s)")
    p.add_argument("--traffic-rate", type=finite(0), default=60.0, help="requests/s through the lab edge")
    p.add_argument("--stop", action="store_true",
                   help="stop a pipeline started by another `opsloop run` (with the config it was started with)")
    p.add_argument("--duration", type=finite(0), default=0, help="run this many seconds, then stop (0 = until Ctrl-C)")
    p.add_argument("--free-ports", action="store_true",
                   help="free loopback ports for the lab and the services the config does not place (tests)")
    p.add_argument("--max-restarts", type=integer(0), default=5,
                   help="restarts of one child allowed within the window (default %(default)s)")
    p.add_argument("--restart-window", type=finite(0, low_ok=False), default=300.0,
                   help="the restart budget's window, seconds (default %(default)s)")
    return p


def recorded_config(run_dir: Path) -> tuple[Settings, Path] | None:
    """The config a pipeline in ``run_dir`` was started with (``effective_config`` wrote it); None if none."""
    path = run_dir / "opsloop.yaml"
    if not path.is_file():
        return None
    return load_settings(path, discover=False), path


def _configure(a: argparse.Namespace, ports: LabPorts) -> tuple[Settings, Path] | None:
    """``effective_config`` with its errors as one line on stderr (None then)."""
    try:
        return effective_config(a.config, a.run_dir, ports)
    except ConfigError as e:
        print(f"opsloop run: {e}", file=sys.stderr)
    except OSError as e:   # a --run-dir it cannot create or write: was a traceback
        print(f"opsloop run: --run-dir {a.run_dir}: cannot write {e.filename or a.run_dir}: {e.strerror}",
              file=sys.stderr)
    return None


def _stop(a: argparse.Namespace) -> int:
    # What runs was started with the run dir's opsloop.yaml: rebuilt from --config or the defaults (as before),
    # a run started with another stack.data_dir kept its Kafka, Prometheus and Alertmanager after `make stop`.
    try:
        found = recorded_config(a.run_dir)
    except ConfigError as e:
        print(f"opsloop run --stop: {e}; stopping by {a.config or 'the defaults'} instead", file=sys.stderr)
        found = None
    found = found or _configure(a, LabPorts())
    if found is None:
        return 2
    stop_running(a.run_dir, *found)
    print("pipeline stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.stop:
        return _stop(a)
    me = run_pidfile(a.run_dir)
    if me.running():   # before the config is written: a refused run rewrote the running one's opsloop.yaml
        print(f"opsloop run: already running (pid {me.read_pid()[0]}, {me.pidfile}); "  # type: ignore[index]
              "`make stop` (`opsloop run --stop`) stops it", file=sys.stderr)
        return 1
    ports = LabPorts.free() if a.free_ports else LabPorts()
    found = _configure(a, ports)
    if found is None:
        return 2
    settings, config_path = found
    write_pidfile(me.pidfile, os.getpid())
    try:
        return _run(a, settings, config_path, ports)
    finally:
        me.pidfile.unlink(missing_ok=True)


def opsloop_command() -> str:
    """The ``opsloop`` next to this interpreter (the venv's): a new user's shell has no venv on its PATH, so
    the bare ``opsloop ...`` the banner printed was "command not found"."""
    exe = Path(sys.executable).with_name("opsloop")
    return str(exe) if exe.exists() else "opsloop"


def banner(stack: Stack, s: Settings, run_dir: Path, ports: LabPorts) -> str:
    """What `opsloop run` prints once everything is up: every address, and commands to paste as they are."""
    cli, cfg = opsloop_command(), run_dir / "opsloop.yaml"
    return f"""
opsloop is running.
  Prometheus     {stack.prometheus_url}/graph?g0.expr=opsloop_lb_server_requests_per_second
  Alertmanager   {stack.alertmanager_url}
  Kafka          {stack.kafka_bootstrap}   (topics telemetry.*, findings, edge.weights, telemetry.deadletter)
  lab edge       http://127.0.0.1:{ports.frontend}/  (HAProxy; origins near :{ports.near}, far :{ports.far})
  /metrics       stream worker :{s.stream.metrics_port} · haproxy collector :{s.collector.metrics_port} \
· ipmi collector :{ports.ipmi_metrics} · paging :{ports.paging_metrics}
  BMCs           {SIMULATED_BMCS} simulated BMCs (ipmi_sim); set one's power: write watts to \
{run_dir}/bmcs/state/<host>/watts
  edge loop      controller :{ports.edge_metrics} (API :{ports.edge_api}, token in {run_dir}/edge-api.token) \
· actuator :{ports.actuator_metrics}
                 weights: {cli} weights show --config {cfg} --edge lab-edge
                 applied versions: {cli} weights history --config {cfg} --edge lab-edge
  pages          {run_dir}/pager/pages.jsonl (Alertmanager → lab pager on :{ports.pager})
  dead letters   {cli} deadletter summary --config {cfg} --since 1h
  logs           {run_dir}/*/ and {s.stack.data_dir}/*/
Ctrl-C (or `make stop` in another shell) stops everything.
"""


def _run(a: argparse.Namespace, settings: Settings, config_path: Path, ports: LabPorts) -> int:
    setup_logging("opsloop-run")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stack = Stack(settings.stack, alertmanager_config=alertmanager_config(a.run_dir, ports))
    (a.run_dir / "bmcs" / "inventory.yaml").unlink(missing_ok=True)  # the BMC simulator's readiness signal
    children: list[ManagedProcess] = []
    try:
        print("starting the stack (Kafka, Alertmanager, Prometheus) ...", flush=True)
        children += stack.up()
        for name, port in scrape_targets(ports).items():
            stack.add_scrape_target(name, f"127.0.0.1:{port}")
        for proc in pipeline_processes(settings, config_path, a.run_dir, a.traffic_rate, ports):
            if stop.is_set():
                break
            print(f"starting {proc.name} ...", flush=True)
            proc.start()
            children.append(proc)
    except StackError as e:
        print(f"opsloop run: {e}", file=sys.stderr)
        stop_all(a.run_dir, settings, config_path)
        return 1
    if stop.is_set():
        print("stopping ...", flush=True)
        stop_all(a.run_dir, settings, config_path)
        return 0
    print(banner(stack, settings, a.run_dir, ports), flush=True)
    supervisor = Supervisor(children, max_restarts=a.max_restarts, window_s=a.restart_window)
    deadline = time.monotonic() + a.duration if a.duration else None
    code = 0
    while not stop.wait(1.0):
        if deadline and time.monotonic() > deadline:
            break
        try:
            supervisor.check()
        except RestartBudgetExceeded as e:
            print(f"opsloop run: {e}\nstopping everything.", file=sys.stderr, flush=True)
            code = 1
            break
    print("stopping ...", flush=True)
    stop_all(a.run_dir, settings, config_path)
    print("stopped", flush=True)
    return code
