"""Starting the pipeline's processes (stream worker, collectors, the closed edge loop) for end-to-end tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import os
import sys

import requests

from opsloop.controllers.edge.service.api_token import create_token_file
from opsloop.lb.haproxy import HaproxyAPI, parse_show_stat
from opsloop.stack import ManagedProcess, Stack, free_port
from tests.helpers import REPO, metrics_up, opsloop_process, unique, wait_until, write_config


def pipeline_config(tmp: Path, stack: Stack, collectors: dict[str, Any] | None = None,
                    interval_s: float = 1.0) -> tuple[Path, dict[str, Any]]:
    doc: dict[str, Any] = {
        "kafka": {"bootstrap_servers": stack.kafka_bootstrap, "partitions": 4},
        "stream": {"app_id": unique("opsloop-test"), "data_dir": str(tmp / "streams"),
                   "metrics_port": free_port(), "web_port": free_port(), "batch_within_s": 0.2},
        "collector": {"interval_s": interval_s, "spool_dir": str(tmp / "spool"), "metrics_port": free_port(),
                      "send_timeout_s": 3.0},
        "collectors": collectors or {},
    }
    return write_config(tmp / "opsloop.yaml", doc), doc


def start_worker(tmp: Path, config: Path, doc: dict[str, Any], stack: Stack) -> ManagedProcess:
    port = doc["stream"]["metrics_port"]
    w = opsloop_process("stream-worker", ["stream", "worker", "--config", str(config)], tmp / "worker",
                        ready=lambda: metrics_up(port))
    w.start()
    stack.add_scrape_target(f"worker-{port}", f"127.0.0.1:{port}")
    return w


def start_collector(name: str, tmp: Path, config: Path, doc: dict[str, Any], stack: Stack) -> ManagedProcess:
    port = doc["collector"]["metrics_port"]
    c = opsloop_process(f"collector-{name}", ["collect", name, "--config", str(config)], tmp / f"collector-{name}",
                        ready=lambda: metrics_up(port))
    c.start()
    stack.add_scrape_target(f"collector-{name}-{port}", f"127.0.0.1:{port}")
    return c


@dataclass(frozen=True)
class LoopConfig:
    """The closed edge loop's config over one lab edge (near: 40 req/s, far: 1000 req/s) and its ports."""

    config: Path
    doc: dict[str, Any]
    lb: str
    token: str
    api_port: int
    edge_port: int
    actuator_port: int


def loop_config(tmp: Path, stack: Stack, admin_socket: Path, near_capacity: float = 40.0,
                overrides_file: Path | None = None, controller: dict[str, Any] | None = None) -> LoopConfig:
    """Collector + worker + edge control (1 s intervals, API with a 0600 token file) + HAProxy actuator;
    ``controller``: tunables under ``controllers.edge.controller`` beside the 10 s staleness."""
    lb, token, api_port = unique("edge"), "t0ken-" + unique("x"), free_port()
    create_token_file(tmp / "edge.token", token)
    edge_port, actuator_port = free_port(), free_port()
    config, doc = pipeline_config(tmp, stack, {"haproxy": {"instances": {lb: str(admin_socket)}}})
    doc["controllers"] = {
        "edge": {"interval_s": 1.0, "metrics_port": edge_port,
                 "overrides_file": None if overrides_file is None else str(overrides_file),
                 "api": {"port": api_port, "token_file": str(tmp / "edge.token")},
                 "controller": {"stale_after_s": 10, **(controller or {})},
                 "topology": {"listeners": [{
                     "name": "web", "backend": "be_web", "edges": [{"name": lb}],
                     "origins": [{"name": "near", "capacity_rps": near_capacity},
                                 {"name": "far", "capacity_rps": 1000.0}],
                     "latency_ms": {lb: {"near": 2, "far": 30}}}]}},
        "actuator": {"mode": "live", "stale_after_s": 30, "store_dir": str(tmp / "actuator-store"),
                     "targets": [{"edge": lb, "listener": "web", "kind": "haproxy", "socket": str(admin_socket),
                                  "backend": "be_web", "servers": {"near": "near", "far": "far"}}]}}
    write_config(config, doc)
    return LoopConfig(config, doc, lb, token, api_port, edge_port, actuator_port)


def start_weight_actuator(tmp: Path, loop: LoopConfig, stack: Stack) -> ManagedProcess:
    """`opsloop weights run` for the loop's edge, scraped by the stack's Prometheus."""
    port = loop.actuator_port
    proc = opsloop_process("actuator", ["weights", "run", "--config", str(loop.config), "--edge", loop.lb,
                                        "--metrics-port", str(port)], tmp / "actuator", ready=lambda: metrics_up(port))
    proc.start()
    stack.add_scrape_target(f"actuator-{port}", f"127.0.0.1:{port}")
    return proc


LISTENER = "web"      # what loop_config names the listener and its HAProxy backend
HTTP_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx", "other")   # HAProxy's hrsp_* response counters
BACKEND = "be_web"


class EdgeControl:
    """The edge control service process and its API."""

    def __init__(self, config: Path, workdir: Path, api_port: int, token: str) -> None:
        self.config, self.workdir, self.api_port, self.token = config, workdir, api_port, token
        self.proc: ManagedProcess | None = None

    def start(self) -> "EdgeControl":
        self.proc = ManagedProcess(
            name="edge-control", argv=[sys.executable, "-m", "opsloop.controllers.edge.service", "run", "--config",
                                       str(self.config)],
            workdir=self.workdir, env={"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
            ready=self._ready, ready_timeout_s=90)
        self.proc.start()
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def _ready(self) -> bool:
        return requests.get(f"http://127.0.0.1:{self.api_port}/openapi.json", timeout=1).ok

    def call(self, method: str, path: str, body: Any = None) -> Any:
        r = requests.request(method, f"http://127.0.0.1:{self.api_port}{path}", json=body, timeout=5,
                             headers={"Authorization": f"Bearer {self.token}"})
        r.raise_for_status()
        return r.json()

    def status(self) -> dict[str, Any]:
        return self.call("GET", "/v1/status")[LISTENER]


def server_requests(api: HaproxyAPI) -> dict[str, int]:
    """Requests HAProxy sent to each server so far (sum of its HTTP response counters)."""
    out = {}
    for row in parse_show_stat(api.show_stat()):
        if row["pxname"] == BACKEND and row["svname"] in ("near", "far"):
            out[row["svname"]] = sum(int(row.get(f"hrsp_{c}") or 0) for c in HTTP_CLASSES)
    return out


def wait_ticks(ctl: EdgeControl, n: int) -> dict[str, Any]:
    start = ctl.status().get("tick", 0)
    return wait_until(lambda: (s := ctl.status()).get("tick", 0) >= start + n and s, timeout=60, interval=0.2,
                      what=f"{n} controller intervals")


def haproxy_near_share(api: HaproxyAPI) -> float | None:
    near, far = api.get_weight(BACKEND, "near")[0], api.get_weight(BACKEND, "far")[0]
    return near / (near + far) if near + far > 0 else None


def applied(hap: HaproxyAPI, ctl: EdgeControl, lb: str) -> dict[str, Any]:
    """Wait until HAProxy's weights (read back) carry the controller's current shares; returns that status."""
    def done() -> dict[str, Any] | None:
        s = ctl.status()
        share = haproxy_near_share(hap)
        want = (s.get("weights") or {}).get(lb, {}).get("near")
        return s if want is not None and share is not None and abs(share - want) <= 0.01 else None
    return wait_until(done, timeout=60, interval=0.2, what="weights applied in HAProxy")


class Stoppable(Protocol):
    def stop(self) -> Any: ...


def stop_all(*parts: Stoppable) -> None:
    """Stop every part in the order given (traffic first, the stream worker last), each even if an
    earlier one failed to stop; the first failure is raised once all are stopped."""
    errors: list[BaseException] = []
    for part in parts:
        try:
            part.stop()
        except Exception as e:   # noqa: BLE001 - re-raised below, after the rest are stopped
            errors.append(e)
    if errors:
        raise errors[0]
