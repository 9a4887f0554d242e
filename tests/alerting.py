"""Alerting fixtures and helpers (a plugin of tests/conftest.py, imported by the e2e and fault suites): a webhook receiver that records what Alertmanager delivers, an
Alertmanager running our rendered config, and the paging actuator as a process."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kafka import KafkaProducer

from opsloop.controllers.paging.amconfig import write_alertmanager_config
from opsloop.stack import ManagedProcess, free_port
from opsloop.stack.components import alertmanager
from tests.helpers import REPO, metrics_up, unique

ROUTING_KEY = "r0utingkey-for-tests-only"


@dataclass
class Delivery:
    path: str
    body: dict[str, Any]
    received: float           # time.time() on arrival


@dataclass
class WebhookReceiver:
    """Records every POST; answers 202 like PagerDuty's Events API (and webhooks accept any 2xx)."""

    port: int
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def at(self, path: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.path == path]


@contextlib.contextmanager
def webhook_receiver() -> Iterator[WebhookReceiver]:
    recv = WebhookReceiver(free_port())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                doc = json.loads(body)
            except ValueError:
                doc = {"raw": body.decode(errors="replace")}
            with recv.lock:
                recv.deliveries.append(Delivery(self.path, doc, time.time()))
            self.send_response(202)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"status":"success","message":"Event processed"}')

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", recv.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield recv
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def webhook() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as recv:
        yield recv


def start_alertmanager(workdir: Path, webhook: WebhookReceiver, port: int | None = None,
                       all_day_keystone_mute: bool = True) -> ManagedProcess:
    """Our alertmanager.yml, receivers at the webhook, test timings (seconds, not minutes)."""
    key = workdir / "routing-key"
    workdir.mkdir(parents=True, exist_ok=True)
    key.write_text(ROUTING_KEY)
    intervals = None
    if all_day_keystone_mute:
        # The production window is 03:10-04:10 Europe/Zurich; widen it to the whole day so the test
        # does not depend on when it runs (the window itself is checked by amtool and the rule tests).
        intervals = [{"name": "keystone-nightly-accounting",
                      "time_intervals": [{"times": [{"start_time": "00:00", "end_time": "24:00"}],
                                          "location": "Europe/Zurich"}]}]
    cfg = write_alertmanager_config(workdir / "alertmanager.yml", webhook_url=webhook.url, routing_key_file=key,
                                    timings={"group_wait": "1s", "group_interval": "2s", "repeat_interval": "1h"},
                                    time_intervals=intervals)
    am = alertmanager(workdir, "127.0.0.1", port or free_port(), config=cfg)
    am.start()
    return am


def am_url(am: ManagedProcess) -> str:
    host, port = am.ports["web"]
    return f"http://{host}:{port}"


@pytest.fixture(scope="module")
def test_alertmanager(tmp_path_factory: pytest.TempPathFactory, webhook: WebhookReceiver) -> Iterator[ManagedProcess]:
    am = start_alertmanager(tmp_path_factory.mktemp("am"), webhook)
    try:
        yield am
    finally:
        am.stop()


def start_actuator(workdir: Path, bootstrap: str, alertmanager_url: str, **paging: Any) -> tuple[ManagedProcess, int]:
    port = free_port()
    section = {"alertmanager_urls": [alertmanager_url], "group_id": unique("opsloop-paging-test"),
               "metrics_port": port, "state_file": str(workdir / "state.json"), "resend_interval_s": 2.0,
               "ends_after_s": 60.0, "backoff_initial_s": 0.5, "backoff_max_s": 2.0, "poll_timeout_s": 0.5}
    section.update(paging)
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "opsloop.yaml"
    config.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": bootstrap},
                                      "controllers": {"paging": section}}))
    proc = ManagedProcess(name="paging", argv=[sys.executable, "-m", "opsloop.controllers.paging.cli", "run",
                                               "--config", str(config)],
                          workdir=workdir, env={"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
                          ready=lambda: metrics_up(port), ready_timeout_s=60, ports={"metrics": ("127.0.0.1", port)})
    proc.start()
    return proc, port


def ensure_topics(bootstrap: str, *topics: str) -> None:
    """Create topics up front so a fresh consumer sees them at its first metadata fetch."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        existing = set(admin.list_topics())
        new = [NewTopic(t, num_partitions=4, replication_factor=1) for t in topics if t not in existing]
        if new:
            try:
                admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()


@pytest.fixture(scope="module")
def producer(kafka_bootstrap: str) -> Iterator[KafkaProducer]:
    ensure_topics(kafka_bootstrap, "findings", "audit")
    p = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        yield p
    finally:
        p.close()
