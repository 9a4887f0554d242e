"""The ``edge.weights`` record bounds its stamp itself (opsloop/records/edge.py): a version up to 2**63 - 1 and an
epoch up to 9999-12-31T23:59:59.999Z in ms round-trip exactly; beyond them a record is refused at decode with one
line naming the field and the value, as any decode error (each consumer dead-letters or skips it).

Before, the bounds lived at each consumer: a record with version 2**64 - 1 or an epoch of 2**63 - 1 decoded, and
then the actuators refused it at apply (after queueing it), the edge controller's recovery had to skip it by a
check of its own, and a reader without such a check (a dashboard, a script) took it."""

from __future__ import annotations

import orjson
import pytest

from opsloop.records import EdgeWeights
from opsloop.records.base import RecordError

# spelt out: these tests run on the record before it had them
MAX_VERSION = 2 ** 63 - 1
LAST_EPOCH = 253_402_300_799_999
GOOD = {"version": 7, "epoch": 1_800_000_000_000, "listener": "web", "edge": "ams1",
        "weights": {"near": 0.25, "far": 0.75}, "computed_at": 1_800_000_000.0}


@pytest.mark.parametrize("version, epoch", [(0, 0), (MAX_VERSION, 0), (0, LAST_EPOCH), (MAX_VERSION, LAST_EPOCH)])
def test_the_edges_of_the_ranges_round_trip_exactly(version: int, epoch: int) -> None:
    raw = orjson.dumps({**GOOD, "version": version, "epoch": epoch})
    record = EdgeWeights.decode(raw)
    assert record.stamp == (epoch, version)
    again = EdgeWeights.decode(record.encode())
    assert again == record and orjson.loads(again.encode())["version"] == version   # no float on the way


@pytest.mark.parametrize("field, value", [("version", MAX_VERSION + 1), ("version", 2 ** 64 - 1),
                                          ("epoch", LAST_EPOCH + 1), ("epoch", MAX_VERSION),
                                          ("epoch", 2 ** 64 - 1)])
def test_a_stamp_beyond_its_range_is_refused_at_decode_naming_field_and_value(field: str, value: int) -> None:
    raw = orjson.dumps({**GOOD, field: value})
    with pytest.raises(RecordError) as decoded:
        EdgeWeights.decode(raw)
    with pytest.raises(RecordError) as built:
        EdgeWeights.build(**{**GOOD, field: value})
    for message in (str(decoded.value), str(built.value)):
        assert message.startswith(f"edge weights record: {field}: ") and str(value) in message, message
        assert "\n" not in message and len(message) < 300, message


@pytest.mark.parametrize("field", ["version", "epoch"])
def test_a_stamp_beyond_its_range_in_text_json_is_refused_too(field: str) -> None:
    """2**64 does not fit orjson's integers: it reads as a float, refused all the same."""
    raw = orjson.dumps({**GOOD, field: 0}).replace(f'"{field}":0'.encode(), f'"{field}":{2 ** 64}'.encode())
    with pytest.raises(RecordError, match=rf"^edge weights record: {field}: "):
        EdgeWeights.decode(raw)
