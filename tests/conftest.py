"""Session fixtures: one real local stack (Kafka KRaft, Prometheus, Alertmanager) on free loopback ports.

Started once per test session by the same manager `opsloop stack up` uses, stopped by PID at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from opsloop.config import StackSettings
from opsloop.stack import Stack, free_port

# fixtures shared across folders: Alertmanager + webhook + findings producer; one Elasticsearch per session
pytest_plugins = ["tests.alerting", "tests.es_fixture"]


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data = tmp_path_factory.mktemp("stack")
    settings = StackSettings(data_dir=data, kafka_port=free_port(), kafka_controller_port=free_port(),
                             prometheus_port=free_port(), alertmanager_port=free_port(), scrape_interval_s=1.0,
                             scrape_targets=[])
    st = Stack(settings)
    st.up()
    try:
        yield st
    finally:
        st.down()


@pytest.fixture(scope="session")
def kafka_bootstrap(stack: Stack) -> str:
    return stack.kafka_bootstrap


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def lab_edge(tmp_path: Path) -> Iterator["LabEdge"]:
    """HAProxy in front of two local origins ("near" and "far"), stopped by PID after the test."""
    edge = LabEdge(tmp_path / "edge")
    try:
        yield edge
    finally:
        edge.stop()


class LabEdge:
    def __init__(self, workdir: Path) -> None:
        from opsloop.lab.edge import OriginSpec

        self.workdir = workdir
        self.origins = [OriginSpec("near", free_port()), OriginSpec("far", free_port(), latency_ms=5)]
        self.procs: list = []
        self.spec = None

    def start(self, capacities: dict[str, float] | None = None, **edge_kwargs: object) -> "LabEdge":
        from opsloop.lab.edge import EdgeSpec, haproxy_process, origin_process

        for o in self.origins:
            o.capacity = (capacities or {}).get(o.name, 0.0)
            p = origin_process(o, self.workdir)
            p.start()
            self.procs.append(p)
        self.spec = EdgeSpec(self.workdir, free_port(), self.origins, **edge_kwargs)  # type: ignore[arg-type]
        h = haproxy_process(self.spec)
        h.start()
        self.procs.append(h)
        return self

    @property
    def url(self) -> str:
        assert self.spec is not None
        return f"http://127.0.0.1:{self.spec.frontend_port}/"

    @property
    def admin_socket(self) -> Path:
        assert self.spec is not None
        return self.spec.admin_socket

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()
