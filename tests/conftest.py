"""Session fixtures: one real local stack (Kafka KRaft, Prometheus, Alertmanager) on free loopback ports.

Started once per test session by the same manager `opsloop stack up` uses, stopped by PID at the end.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client import REGISTRY

from opsloop.config import StackSettings
from opsloop.stack import Stack, free_port
from opsloop.stack.process import PORT_RANGE_ENV, port_range_slice
from tests.kafka_secure import SecureBroker, secure_broker

# fixtures shared across folders: Alertmanager + webhook + findings producer; one Elasticsearch per session
pytest_plugins = ["tests.alerting", "tests.es_fixture"]

# `make test` runs the files on parallel workers (pytest-xdist, --dist loadfile: a file's tests and its
# module fixtures stay on one worker; each worker has its own session stack). Each worker picks free
# ports from its own slice, inherited by the processes it starts: two workers never pick the port the
# other is about to bind.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and PORT_RANGE_ENV not in os.environ:
    os.environ[PORT_RANGE_ENV] = port_range_slice(int(_WORKER[2:]),
                                                  int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))

# The longest files (measured, 25-140 s each) are handed out first, so that the parallel workers do not
# end on one of them while the other is idle; the order within a file is kept.
LONGEST_FIRST = [
    "tests/faults/test_soak.py", "tests/core/test_setup_interrupt.py", "tests/controllers/edge/test_fuzz_scenarios.py",
    "tests/dashboards/test_dashboards.py", "tests/faults/test_broker_absent_at_start.py",
    "tests/core/test_cli_bad_config.py", "tests/core/test_kafka_security.py", "tests/faults/test_paging_actuator_kill.py",
    "tests/e2e/test_secure_pipeline.py", "tests/e2e/test_edge_loop.py", "tests/controllers/actuators/test_cli.py",
    "tests/deploy/test_wheel.py", "tests/faults/test_broker_outage.py", "tests/e2e/test_edge_holddown.py",
    "tests/e2e/test_anomaly_page.py", "tests/scale/test_scale_out.py", "tests/e2e/test_paging_paths.py",
    "tests/lab/test_run_supervision.py",
]


def _sample_value(name: str, labels: dict[str, str] | None = None) -> float | None:
    """``REGISTRY.get_sample_value`` reading only the collector of ``name``: the library's collects every metric
    of the process, and late in a worker's session (tens of thousands of labelled series left by earlier tests)
    each call took ~0.3 s: the state sweeps ran 25 times slower than alone (315 s against 12 s) and timed out."""
    collector = REGISTRY._names_to_collectors.get(name)
    if collector is None:
        return _LIBRARY_SAMPLE_VALUE(name, labels)   # a collector that does not describe its names
    want = labels or {}
    for family in collector.collect():
        for s in family.samples:
            if s.name == name and s.labels == want:
                return s.value
    return None


_LIBRARY_SAMPLE_VALUE = REGISTRY.get_sample_value
REGISTRY.get_sample_value = _sample_value  # type: ignore[method-assign]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest as collected


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


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """One SASL_SSL broker per test process for the modules that need one (each under its own topic prefix or
    topics): a broker start is ~20 s of a loaded machine's time."""
    b = secure_broker(tmp_path_factory.mktemp("kafka-sasl-ssl"))
    b.process.start()
    try:
        yield b
    finally:
        b.process.stop()
