"""Starting the pipeline's processes (stream worker, collectors) for end-to-end tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opsloop.stack import ManagedProcess, Stack, free_port
from tests.helpers import metrics_up, opsloop_process, unique, write_config


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
