"""The JSON log formatter never fails on a field's value: what orjson refuses is written as text."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from opsloop.log import get_logger, setup_logging


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
