"""The Kafka client libraries' warnings and errors through the common logging setup: each counted, one line a
minute per kind (:class:`opsloop.log.ClientLogLimiter` on the handler :func:`opsloop.log.setup_logging` makes).

Every service but the stream worker logged kafka-python's retries as they came, several lines a second for a whole
broker outage (``tests/core/test_kafka_client_logs_outage.py`` with real services). Old code: the flood is written
line for line and nothing is counted.
"""

from __future__ import annotations

import io
import logging
from typing import Iterator

import orjson
import pytest
from prometheus_client import REGISTRY

from opsloop.log import get_logger, setup_logging
from tests.helpers import unique

CLIENT_LINES = "opsloop_kafka_client_log_lines_total"


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[io.StringIO, list[float]]]:
    """setup_logging to a buffer on a fake monotonic clock; pytest's root handlers and level put back after."""
    clock = [10_000.0]
    monkeypatch.setattr("opsloop.log.time.monotonic", lambda: clock[0])
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stream = io.StringIO()
    setup_logging("test", stream=stream)
    try:
        yield stream, clock
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def lines(stream: io.StringIO, logger: str) -> list[tuple[str, str, dict[str, int] | None]]:
    docs = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    return [(d["level"], d["event"], d.get("fields")) for d in docs if d["logger"] == logger]


def counted(logger: str, level: str) -> float:
    return REGISTRY.get_sample_value(CLIENT_LINES, {"logger": logger, "level": level}) or 0.0


@pytest.mark.parametrize("library", ["kafka", "aiokafka"])
def test_a_client_retry_flood_is_one_line_a_minute_per_kind_and_each_counted(
        library: str, logged: tuple[io.StringIO, list[float]]) -> None:
    stream, clock = logged
    # created after setup_logging, as a client module imported later creates its logger
    name = unique(f"{library}.net.manager")
    client = logging.getLogger(name)
    for _ in range(500):   # a retry loop with the broker away: 100 ms apart, 50 s
        client.error("Connection failed: %s", "KafkaConnectionError: 111 ECONNREFUSED")
        clock[0] += 0.1
    client.warning("Marking the coordinator dead (node %s)", 1)   # another kind: its own first line at once
    clock[0] += 11.0
    client.error("Connection failed: %s", "KafkaConnectionError: 111 ECONNREFUSED")
    assert lines(stream, name) == [
        ("error", "Connection failed: KafkaConnectionError: 111 ECONNREFUSED", None),   # none left out: no fields
        ("warning", "Marking the coordinator dead (node 1)", None),
        ("error", "Connection failed: KafkaConnectionError: 111 ECONNREFUSED", {"unlogged_since": 499})]
    assert counted(name, "error") == 501 and counted(name, "warning") == 1


def test_a_message_the_library_formats_itself_is_one_kind_whatever_its_numbers(
        logged: tuple[io.StringIO, list[float]]) -> None:
    """kafka-python formats some lines itself (an f-string: the backoff, a port): without the numbers they are
    one kind, not one per backoff step."""
    stream, clock = logged
    name = unique("kafka.net.manager")
    client = logging.getLogger(name)
    for i in range(50):
        client.error(f"Bootstrap attempt to bootstrap-0 failed: 111 ECONNREFUSED (backoff {0.1 * 2 ** (i % 9):.2f} "
                     f"secs)")
        clock[0] += 0.5
    assert [f for _, _, f in lines(stream, name)] == [None]
    assert counted(name, "error") == 50


def test_our_own_lines_and_the_clients_info_are_left_as_they_are(logged: tuple[io.StringIO, list[float]]) -> None:
    stream, _ = logged
    ours = get_logger(unique("h4"))
    for i in range(5):
        ours.warning("kafka_unavailable", attempt=i)   # our events have their own sampling where they need it
    client_name = unique("kafka.conn")
    client = logging.getLogger(client_name)
    client.setLevel(logging.INFO)   # an operator turning the client's INFO on: every line, none counted
    for _ in range(3):
        client.info("Connecting to %s", "127.0.0.1:9092")
    assert [f["attempt"] for _, _, f in lines(stream, ours._logger.name)] == [0, 1, 2, 3, 4]  # type: ignore[index]
    assert lines(stream, client_name) == [("info", "Connecting to 127.0.0.1:9092", None)] * 3
    assert counted(client_name, "info") == 0
