"""The JSON log formatter never fails on a field's value: what orjson refuses is written as text."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from opsloop.log import Sampled, get_logger, setup_logging


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize("value, shown", [
    (2 ** 70, str(2 ** 70)),                      # orjson: "Integer exceeds 64-bit range"
    (-(2 ** 70), str(-(2 ** 70))),
    ([1, 2 ** 80], [1, str(2 ** 80)]),            # nested too
    ({1: "a"}, {"1": "a"}),                       # a non-str key
    ({3}, "{3}"),
    (b"\xff\x00", "b'\\xff\\x00'"),
    (_BadRepr(), "<_BadRepr not printable>"),
    # bytes that were not UTF-8 read with surrogateescape (a path, a BMC's output): the whole line was lost
    ("a\udcffb", "a\\xffb"),
    ({"k\udc80": ["\ud800"]}, {"k\\x80": ["\\ud800"]}),   # in a key, and a surrogate no byte made
])
def test_any_field_value_is_one_json_line(value: object, shown: object, capsys: pytest.CaptureFixture[str]) -> None:
    stream = io.StringIO()
    setup_logging("test", stream=stream)
    try:
        get_logger("t").info("odd_value", v=value, n=1)
    finally:
        logging.getLogger().handlers[:] = []
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    doc = orjson.loads(lines[0])
    assert doc["event"] == "odd_value"
    assert doc["fields"] == {"v": shown, "n": 1}
    assert "Logging error" not in capsys.readouterr().err


def test_a_library_line_whose_arguments_do_not_fit_its_format_is_one_json_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A library's ``log.warning("%s: %d", name)`` (one argument short): logging's own formatting raises inside the
    handler, which printed "--- Logging error ---" and a traceback to stderr and lost the line."""
    stream = io.StringIO()
    setup_logging("test", stream=stream)
    try:
        logging.getLogger("kafka.conn").warning("node %s: %d retries", "b1")
        logging.getLogger("kafka.conn").warning("fine %s", "line")
    finally:
        logging.getLogger().handlers[:] = []
    docs = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [d["logger"] for d in docs] == ["kafka.conn", "kafka.conn"]
    assert docs[0]["event"].startswith("node %s: %d retries (arguments not formatted: TypeError")
    assert "'b1'" in docs[0]["event"]
    assert docs[1]["event"] == "fine line"
    assert "Logging error" not in capsys.readouterr().err


def test_a_library_line_with_bytes_that_were_not_utf8_is_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    stream = io.StringIO()
    setup_logging("test", stream=stream)
    try:
        logging.getLogger("kafka.conn").warning("reading %s", b"\xfe/dev".decode("utf-8", "surrogateescape"))
    finally:
        logging.getLogger().handlers[:] = []
    [doc] = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert doc["event"] == "reading \\xfe/dev"
    assert "Logging error" not in capsys.readouterr().err

def test_a_repeating_event_is_logged_once_a_minute_per_key_with_the_count_left_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A poison stream's 1,000 refusals in a minute make one line, not 1,000; the next line, a
    minute on, says how many were left out; another key (another agent) has its own minute; the
    table of keys (which may come from data) stays bounded."""
    clock = [500.0]
    monkeypatch.setattr("opsloop.log.time.monotonic", lambda: clock[0])
    stream = io.StringIO()
    setup_logging("test", stream=stream)
    try:
        log, sampled = get_logger("t"), Sampled(60.0)
        logged = [sampled.warning(log, "record_rejected", key="a", n=i) for i in range(1000)]
        assert logged == [True] + [False] * 999
        assert sampled.warning(log, "record_rejected", key="b", n=0)
        clock[0] += 60.0
        assert sampled.warning(log, "record_rejected", key="a", n=1000)
        for k in range(3 * Sampled.MAX_KEYS):
            sampled.warning(log, "record_rejected", key=f"k{k}")
        assert len(sampled._last) <= Sampled.MAX_KEYS
    finally:
        logging.getLogger().handlers[:] = []
    docs = [orjson.loads(line) for line in stream.getvalue().splitlines()][:3]
    # written only when some were left out
    assert [(d["fields"]["n"], d["fields"].get("unlogged_since")) for d in docs] == [(0, None), (0, None), (1000, 999)]


@pytest.mark.parametrize("level, shown", [("debug", True), ("info", False)])
def test_the_kafka_clients_own_lines_go_out_at_debug_only(level: str, shown: bool) -> None:
    """``--log-level debug`` left the Kafka clients pinned at WARNING: an operator debugging a broker problem got
    none of their lines. At info they stay quiet (connection churn); other chatty libraries stay quiet at debug."""
    root = logging.getLogger()
    handlers, root_level = root.handlers[:], root.level
    quiet = {n: logging.getLogger(n).level for n in ("kafka", "aiokafka", "urllib3", "elastic_transport")}
    stream = io.StringIO()
    try:
        setup_logging("test", level, stream=stream)
        logging.getLogger("kafka.conn").debug("connecting to %s", "127.0.0.1:9092")
        logging.getLogger("aiokafka.consumer").info("joined group %s", "g")
        logging.getLogger("urllib3.connectionpool").debug("Starting new HTTP connection")
    finally:
        root.handlers[:] = handlers
        root.setLevel(root_level)
        for name, lv in quiet.items():
            logging.getLogger(name).setLevel(lv)
    said = [(d["logger"], d["event"]) for d in map(orjson.loads, stream.getvalue().splitlines())]
    assert said == ([("kafka.conn", "connecting to 127.0.0.1:9092"), ("aiokafka.consumer", "joined group g")]
                    if shown else [])
