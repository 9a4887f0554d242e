"""The stream worker's logging (Faust replaces setup_logging's handler with the one of ``_logging_config``) keeps
the Kafka client limiter: aiokafka's retries are counted, one line a minute per kind, and the minute is the one
setup_logging's handler started (one limiter per process). Old code: the worker's handler had no limiter (the
stage's sat on the aiokafka loggers that existed when create_app ran), so a logger made later, here one made after
the logging config, wrote every retry under another metric name."""

from __future__ import annotations

import logging
import logging.config

import orjson
import pytest
from prometheus_client import REGISTRY

from opsloop.streams.worker import _logging_config
from tests.helpers import unique

CLIENT_LINES = "opsloop_kafka_client_log_lines_total"


def test_the_workers_log_handler_limits_aiokafka_and_counts_each_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clock = [20_000.0]
    monkeypatch.setattr("opsloop.log.time.monotonic", lambda: clock[0])
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in ("aiokafka", "kafka", "faust.transport", "mode")}
    name = unique("aiokafka.consumer.group_coordinator")
    try:
        logging.config.dictConfig(_logging_config("info"))   # what faust.Worker does at start (ext://sys.stderr)
        client = logging.getLogger(name)
        for _ in range(300):
            client.error("Unable connect to node with id %s: %s", 1, "[Errno 111] Connection refused")
            clock[0] += 0.1
        clock[0] += 31.0
        client.error("Unable connect to node with id %s: %s", 1, "[Errno 111] Connection refused")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for n, lv in levels.items():
            logging.getLogger(n).setLevel(lv)
    docs = [orjson.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    said = [(d["level"], d.get("fields")) for d in docs if d["logger"] == name]
    assert said == [("error", None), ("error", {"unlogged_since": 299})]
    assert REGISTRY.get_sample_value(CLIENT_LINES, {"logger": name, "level": "error"}) == 301


@pytest.mark.parametrize("level, said", [("debug", True), ("info", False)])
def test_the_workers_kafka_client_info_lines_go_out_at_debug_only(
        level: str, said: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """``--log-level debug`` on the worker shows the Kafka clients' own lines (a broker problem is debugged from
    them); at info they stay quiet. Old code: the worker's config pinned them at WARNING whatever the level."""
    root = logging.getLogger()
    handlers, root_level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in ("aiokafka", "kafka", "faust.transport", "mode")}
    name = unique("aiokafka.conn")
    try:
        logging.config.dictConfig(_logging_config(level))
        logging.getLogger(name).info("Connecting to node %s", 7)
    finally:
        root.handlers[:] = handlers
        root.setLevel(root_level)
        for n, lv in levels.items():
            logging.getLogger(n).setLevel(lv)
    docs = [orjson.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert any(d["logger"] == name and d["level"] == "info" for d in docs) is said
