"""The wire format: validation errors name field and value; bad samples never take good ones down."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.records import Metric, deadletter_record, metric
from opsloop.topics import Topic, series_key, topic_for
from opsloop.validation import WireError
from opsloop.wire import encode_batch, group_by_route, parse_record

TS = 1795310400


def test_telegraf_single_sample_shape_parses() -> None:
    raw = b'{"name":"ipmi_power","tags":{"host":"stor-g3-17","source":"dcmi"},"fields":{"watts":155.0},"timestamp":1795310400}'
    p = parse_record(raw)
    assert not p.rejected
    (m,) = p.metrics
    assert m.fields["watts"] == 155.0 and m.tags["host"] == "stor-g3-17"
    assert m.topic is Topic.IPMI and m.key == "stor-g3-17"


def test_batch_roundtrip_keeps_order() -> None:
    ms = [metric("haproxy", {"stot": i}, {"host": "lb1", "sv": f"s{i}"}, TS + i) for i in range(5)]
    p = parse_record(encode_batch(ms))
    assert p.metrics == ms and not p.rejected


def test_bad_sample_in_batch_is_rejected_alone_with_its_position() -> None:
    doc = {"schema_version": 1, "metrics": [
        {"name": "haproxy", "tags": {}, "fields": {"a": 1}, "timestamp": TS},
        {"name": "haproxy", "tags": {}, "fields": {"a": "x", "b": None}, "timestamp": TS},
        {"name": "haproxy", "tags": {}, "fields": {"a": 2}, "timestamp": TS + 1},
    ]}
    p = parse_record(orjson.dumps(doc))
    assert [m.fields["a"] for m in p.metrics] == [1, 2]
    (rej,) = p.rejected
    assert rej.index == 1 and "metrics.1.fields.b" in rej.reason and "None" in rej.reason


@pytest.mark.parametrize("raw, needle", [
    (b"", "empty record"),
    (b"{nope", "not JSON"),
    (b"[1]", "expected an object"),
    (b'{"metrics": {}}', "expected a list"),
    (b'{"metrics": [], "schema_version": 99}', "schema_version: 99"),
    (b'{"metrics": [], "extra": 1}', "unknown keys"),
    (b'{"name":"x","fields":{"a":1},"timestamp":1795310400000}', "milliseconds"),
    (b'{"name":"x","fields":{"a":1},"timestamp":12}', "before 2000"),
    (b'{"name":"x","fields":{},"timestamp":1795310400}', "fields"),
    (b'{"name":"1bad","fields":{"a":1},"timestamp":1795310400}', "name"),
    (b'{"name":"x","fields":{"a":1},"timestamp":1795310400,"junk":true}', "junk"),
    (b'{"name":"x","tags":{"h":1},"fields":{"a":1},"timestamp":1795310400}', "tags.h"),
])
def test_rejections_name_what_was_wrong(raw: bytes, needle: str) -> None:
    p = parse_record(raw)
    assert not p.metrics
    assert p.rejected and needle in p.rejected[0].reason


GOOD_SAMPLE = {"name": "haproxy", "tags": {"host": "h"}, "fields": {"v": 1}, "timestamp": TS}


@pytest.mark.parametrize("version, shown", [(True, "true"), (False, "false"), ([1], "[1]"), ({"v": 1}, "{'v': 1}"),
                                            ("1", "'1'"), (1.5, "1.5")])
def test_a_schema_version_that_is_no_integer_is_refused_naming_it(version: object, shown: str) -> None:
    """`True in {1}` holds in Python: `"schema_version": true` was taken as version 1; a list or an object
    raised TypeError (unhashable) out of parse_record, failing the whole batch of records it came in."""
    p = parse_record(orjson.dumps({"schema_version": version, "metrics": [GOOD_SAMPLE]}))
    assert not p.metrics
    (rej,) = p.rejected
    assert rej.reason == f"schema_version: {shown} is not supported (supported: [1])"


def test_an_integral_float_schema_version_is_version_1_as_in_the_records() -> None:
    # opsloop/records/base.py's Integer takes 12.0 for 12: the batch's version 1.0 is 1, an int
    p = parse_record(orjson.dumps({"schema_version": 1.0, "metrics": [GOOD_SAMPLE]}))
    assert not p.rejected and len(p.metrics) == 1
    assert (p.schema_version, type(p.schema_version)) == (1, int)


def test_non_finite_field_rejected() -> None:
    with pytest.raises(WireError, match="finite"):
        metric("x_y", {"v": math.inf}, timestamp=TS)


def test_an_integer_field_is_int64_or_uint64_as_telegrafs() -> None:
    """Built in code as on the wire, an integer beyond a float's range is refused (JSON's parser
    refused 10**400 already; built in code it went through, and float() raised in every handler);
    the line protocol's int64 and uint64 ends stay integers."""
    for v in (-(2 ** 63), 2 ** 64 - 1):
        assert metric("x_y", {"v": v}, timestamp=TS).fields["v"] == v
    with pytest.raises(WireError, match="fields.v"):
        metric("x_y", {"v": 10 ** 400}, timestamp=TS)


def test_routing_and_keys() -> None:
    assert topic_for("haproxy", {}) is Topic.LB
    assert topic_for("ipvs_real_server", {}) is Topic.LB
    assert topic_for("netperf", {}) is Topic.NETPERF
    assert topic_for("custom", {"opsloop_topic": "telemetry.keystone"}) is Topic.KEYSTONE
    with pytest.raises(WireError, match="no telemetry topic"):
        topic_for("custom", {})
    with pytest.raises(WireError, match="not a known topic"):
        topic_for("custom", {"opsloop_topic": "nope"})
    assert series_key("x", {"edge": "ams", "instance": "i"}) == "ams"
    # a netperf set's records share one partition whichever host measured it (its detector state is per set)
    assert {series_key("netperf_throughput", {"host": h, "target_set": "six-vms"}) for h in ("b1", "b2")} == {"six-vms"}
    groups = group_by_route([metric("haproxy", {"a": 1}, {"host": h}, TS) for h in "abab"])
    assert {k: len(v) for k, v in groups.items()} == {(Topic.LB, "a"): 2, (Topic.LB, "b"): 2}


def test_deadletter_record_keeps_binary_input() -> None:
    doc = orjson.loads(deadletter_record("bad", topic="telemetry.lb", partition=1, offset=7, key=b"k",
                                         value=b"\xff\xfe"))
    assert doc["reason"] == "bad" and doc["offset"] == 7 and doc["value_b64"] == "//4="


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes_never_crash(raw: bytes) -> None:
    p = parse_record(raw)
    assert p.metrics or p.rejected
    for r in p.rejected:
        assert r.reason


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_fuzz_arbitrary_json_never_crash(doc: object) -> None:
    p = parse_record(orjson.dumps(doc))
    assert all(isinstance(m, Metric) for m in p.metrics)
    for r in p.rejected:
        assert r.reason


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 10**9)), min_size=1, max_size=20))
def test_fuzz_batches_keep_every_good_sample(items: list[tuple[bool, int]]) -> None:
    metrics = []
    for good, v in items:
        fields = {"v": v} if good else {"v": {"nested": v}}
        metrics.append({"name": "haproxy", "tags": {"host": "h"}, "fields": fields, "timestamp": TS})
    p = parse_record(orjson.dumps({"metrics": metrics}))
    assert [m.fields["v"] for m in p.metrics] == [v for good, v in items if good]
    assert [r.index for r in p.rejected] == [i for i, (good, _) in enumerate(items) if not good]
