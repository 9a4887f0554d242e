"""Services started while the broker is away wait for it instead of dying.

kafka-python builds a client by asking a broker for its API versions: with no broker the constructor
raises ``NoBrokersAvailable``, before any retry loop of the service. The paging actuator and the edge
control service used to die there with a traceback (a reboot where they come up before Kafka, a
broker restart at the wrong moment). Now each retries with back-off (``opsloop.kafka_clients.
connect_with_retry``) and starts normally once the real broker is back: here the session's broker is
stopped, the services are started, and the broker is started again.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaProducer

import opsloop.controllers.edge.service.app as edge_service_module
import opsloop.controllers.paging.service as paging_service_module
from opsloop.records import EdgeWeights
from opsloop.controllers.edge.service.app import EdgeService
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from opsloop.topics import Topic
from opsloop.records import EdgeDemand, OriginState
from tests.controllers.edge.service.test_service import service_config
from tests.helpers import read_topic, unique, wait_until

pytestmark = pytest.mark.integration


class RecordingLog:
    """Stands in for a module's structured logger: keeps (level, event, fields)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def _add(self, level: str, event: str, **fields: Any) -> None:
        with self._lock:
            self.events.append((level, event, fields))

    def debug(self, event: str, **fields: Any) -> None:
        self._add("debug", event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._add("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._add("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._add("error", event, **fields)

    def count(self, event: str) -> int:
        with self._lock:
            return sum(1 for _, e, _ in self.events if e == event)


def test_paging_and_edge_control_wait_for_a_broker_that_is_away_at_start(stack, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    paging_log, edge_log = RecordingLog(), RecordingLog()
    monkeypatch.setattr(paging_service_module, "log", paging_log)
    monkeypatch.setattr(edge_service_module, "log", edge_log)
    listener, edge = unique("absent"), unique("lb")
    settings, cfg = service_config(stack.kafka_bootstrap, listener, edge)
    paging = PagingService(PagingConfig(state_file=tmp_path / "paging.json", start_offset="latest",
                                        backoff_initial_s=0.2), stack.kafka_bootstrap)
    edge_svc = EdgeService(settings, cfg)
    paging_stop = threading.Event()
    failures: list[BaseException] = []

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - the test reports it
                failures.append(e)
        return run

    stack.component("kafka").stop()
    threads = [threading.Thread(target=guarded(lambda: paging.run(paging_stop)), daemon=True),
               threading.Thread(target=guarded(edge_svc.start), daemon=True)]
    try:
        for t in threads:
            t.start()
        # Both keep trying (each attempt is a warning naming the service), and neither died.
        wait_until(lambda: paging_log.count("kafka_unavailable") >= 2 and edge_log.count("kafka_unavailable") >= 2,
                   timeout=120, what="retries of both services while the broker is away")
        assert failures == [] and all(t.is_alive() for t in threads)
        assert paging_log.count("paging_started") == 0
    finally:
        stack.start_component("kafka")
    try:
        wait_until(lambda: paging_log.count("paging_started") == 1, timeout=120, what="paging actuator started")
        threads[1].join(timeout=120)
        assert not threads[1].is_alive(), "the edge control service did not finish starting"
        assert failures == []
        # The edge service works: demand in, weights out.
        assert edge_svc.consumer is not None and edge_svc.consumer.assigned.wait(60)
        producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap)
        try:
            def send_demand_and_tick() -> list[EdgeWeights]:
                rec = EdgeDemand(edge=edge, backend=f"be-{listener}", demand_rps=80.0,
                                 origins={"near": OriginState(rps=40.0), "far": OriginState(rps=40.0)},
                                 timestamp=time.time())
                producer.send(Topic.EDGE_DEMAND.value, key=rec.key.encode(), value=rec.encode())
                producer.flush()
                edge_svc.tick()
                return [EdgeWeights.decode(r.value) for r in read_topic(stack.kafka_bootstrap, Topic.EDGE_WEIGHTS.value)
                        if orjson.loads(r.value).get("listener") == listener]

            recs = wait_until(send_demand_and_tick, timeout=60, interval=1.0,
                              what="weights published after the broker came back")
        finally:
            producer.close()
        assert {r.edge for r in recs} == {edge}
        assert threads[0].is_alive() and paging_log.count("step_failed") == 0
    finally:
        paging_stop.set()
        edge_svc.stop()
        threads[0].join(timeout=30)
