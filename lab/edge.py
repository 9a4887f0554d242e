"""An HAProxy edge in front of local origins, run as a managed process with an admin socket."""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from opsloop.stack.process import ManagedProcess, require_binary


@dataclass
class OriginSpec:
    name: str
    port: int
    capacity: float = 0.0
    latency_ms: float = 0.0
    weight: int = 100

    def health_file(self, workdir: Path) -> Path:
        return workdir / f"{self.name}.health"


@dataclass
class EdgeSpec:
    workdir: Path
    frontend_port: int
    origins: list[OriginSpec]
    listener: str = "web"
    bind: str = "127.0.0.1"
    check_interval_ms: int = 500
    extra_backend_lines: list[str] = field(default_factory=list)

    @property
    def backend(self) -> str:
        return f"be_{self.listener}"

    @property
    def frontend(self) -> str:
        return f"fe_{self.listener}"

    @property
    def admin_socket(self) -> Path:
        return self.workdir / "haproxy.sock"


def haproxy_config(spec: EdgeSpec) -> str:
    servers = "\n".join(
        f"    server {o.name} {spec.bind}:{o.port} weight {o.weight} check inter {spec.check_interval_ms}ms "
        "fall 2 rise 2" for o in spec.origins)
    extra = "\n".join(f"    {line}" for line in spec.extra_backend_lines)
    return f"""global
    stats socket {spec.admin_socket} mode 600 level admin
    maxconn 2000

defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
    option http-keep-alive

frontend {spec.frontend}
    bind {spec.bind}:{spec.frontend_port}
    default_backend {spec.backend}

backend {spec.backend}
    balance roundrobin
    option httpchk GET /health
    retry-on 503
    retries 0
{servers}
{extra}
"""


def _unix_ready(path: Path) -> bool:
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(0.5)
        return s.connect_ex(str(path)) == 0


@dataclass
class HaproxyProcess(ManagedProcess):
    """HAProxy whose binary is looked up and whose config is written when it starts, not when the handle is
    built: listing or stopping the lab's processes (`opsloop run --help`, `--stop`) needs no haproxy
    installed and writes nothing."""

    edge: EdgeSpec | None = None

    def start(self) -> None:
        assert self.edge is not None
        self.argv[0] = require_binary("haproxy", "install Debian's haproxy package (make setup)")
        self.edge.workdir.mkdir(parents=True, exist_ok=True)
        (self.edge.workdir / "haproxy.cfg").write_text(haproxy_config(self.edge))
        super().start()


def haproxy_process(spec: EdgeSpec) -> HaproxyProcess:
    cfg = spec.workdir / "haproxy.cfg"
    return HaproxyProcess(name="haproxy", argv=["haproxy", "-db", "-f", str(cfg)], workdir=spec.workdir,
                          ports={"frontend": (spec.bind, spec.frontend_port)},
                          ready=lambda: _unix_ready(spec.admin_socket), ready_timeout_s=15, edge=spec)


def origin_process(spec: OriginSpec, workdir: Path, bind: str = "127.0.0.1") -> ManagedProcess:
    import requests

    argv = [sys.executable, "-m", "opsloop.lab.origin", "--name", spec.name, "--bind", bind, "--port", str(spec.port),
            "--capacity", str(spec.capacity), "--latency-ms", str(spec.latency_ms),
            "--health-file", str(spec.health_file(workdir))]
    return ManagedProcess(name=f"origin-{spec.name}", argv=argv, workdir=workdir, ports={"http": (bind, spec.port)},
                          ready=lambda: requests.get(f"http://{bind}:{spec.port}/health", timeout=1).ok,
                          ready_timeout_s=15)
