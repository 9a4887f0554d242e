"""The decode fast path (``opsloop.wire._good_batch``) accepts only what the general path accepts, alike.

``parse_record`` takes a batch in which nothing is wrong in one pydantic-core call from its bytes;
everything else goes the general way (orjson, then validation per batch and per sample), which alone
words rejections. These tests hold the two side by side: for any input the fast path takes, the
general path must give the same samples (values *and* types), the same schema version and no rejection.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.wire import Parsed, Rejected, _good_batch, parse_document, parse_record

T = 1_795_310_400


def general(raw: bytes) -> Parsed:
    """The general path alone (what parse_record did before the fast path)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Parsed(rejected=[Rejected("not JSON")])   # the fast path must not have taken it (checked below)
    return parse_document(doc)


def typed(p: Parsed) -> list[Any]:
    return [(m.name, [(k, type(v).__name__, v) for k, v in m.tags.items()],
             [(k, type(v).__name__, v) for k, v in m.fields.items()], type(m.timestamp).__name__, m.timestamp)
            for m in p.metrics]


def assert_alike(raw: bytes) -> None:
    fast = _good_batch(raw)
    if fast is None:
        return
    slow = general(raw)
    assert not slow.rejected, raw
    assert typed(fast) == typed(slow), raw
    assert (fast.schema_version, type(fast.schema_version), fast.batch) == \
        (slow.schema_version, type(slow.schema_version), slow.batch), raw
    assert parse_record(raw) == fast


def sample(value: str, ts: str = str(T)) -> str:
    return '{"name":"m","tags":{"host":"a"},"fields":{"v":%s},"timestamp":%s}' % (value, ts)


@pytest.mark.parametrize("raw", [
    '{"metrics":[%s]}' % sample("1"),
    '{"schema_version":1,"metrics":[%s,%s]}' % (sample("1.5"), sample('"x"')),
    '{"metrics":[%s]}' % sample("true"), '{"metrics":[%s]}' % sample("-0"), '{"metrics":[%s]}' % sample("1E2"),
    '{"metrics":[%s]}' % sample("18446744073709551615"),            # u64: both read an int
    '{"metrics":[%s]}' % sample("123456789012345678901234"),        # beyond 64 bits: orjson reads a float
    '{"metrics":[%s]}' % sample("-9223372036854775809"),
    '{"metrics":[%s]}' % sample("0.12345678901234567890123"),
    '{"metrics":[%s]}' % sample("1", '"%d"' % T),                    # timestamp as a string
    '{"metrics":[%s]}' % sample("1", "%d.5" % T),
    '{"metrics":[%s]}' % sample('"\\u00e9"'),
    '{"metrics":[%s]}' % sample('"\\ud800"'),                         # lone surrogate: not JSON to orjson
    '{"metrics":[{"name":"m","name":"n","tags":{},"fields":{"v":1,"w":2,"v":3},"timestamp":%d}]}' % T,  # duplicates
    '{"schema_version":true,"metrics":[%s]}' % sample("1"),          # version true / 1.0: general path
    '{"schema_version":1.0,"metrics":[%s]}' % sample("1"),
    '{"schema_version":2,"metrics":[%s]}' % sample("1"),
    '{"metrics":[%s],"x":1}' % sample("1"),
    '{"metrics":[%s]} x' % sample("1"), '\ufeff{"metrics":[%s]}' % sample("1"), ' \n{"metrics":[%s]}\n' % sample("1"),
    '{"metrics":[%s]}' % sample("NaN"), '{"metrics":[%s]}' % sample("1e400"), '{"metrics":[%s]}' % sample('"a\tb"'),
    '{"metrics":[]}', '{"metrics":null}', sample("1"), '["metrics"]',
])
def test_fast_path_takes_only_what_the_general_path_takes_alike(raw: str) -> None:
    assert_alike(raw.encode("utf-8", "surrogatepass"))


def test_fast_path_takes_the_ordinary_batch_and_leaves_the_rest() -> None:
    assert _good_batch(b'{"schema_version":1,"metrics":[%s]}' % sample("1").encode()) is not None
    assert _good_batch(sample("1").encode()) is None                       # one sample: general path
    assert _good_batch(b'{"metrics":[%s]}' % sample("NaN").encode()) is None
    assert _good_batch(b'{"schema_version":true,"metrics":[%s]}' % sample("1").encode()) is None
    assert _good_batch(b'{"metrics":[%s]}' % sample("123456789012345678901234").encode()) is None


scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
           | st.sampled_from([T, float(T), str(T), "m", "host", "metrics", "schema_version"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["name", "tags", "fields", "timestamp", "host", "v", "x"]), inner, max_size=4), max_leaves=12)
samples = st.fixed_dictionaries({"name": st.sampled_from(["m", "a.b", "1x", ""]) | scalars,
                                 "tags": st.dictionaries(st.text(max_size=3), st.text(max_size=3) | scalars, max_size=2),
                                 "fields": st.dictionaries(st.text(max_size=3), scalars, max_size=3),
                                 "timestamp": scalars},
                                optional={"x": values})


@settings(max_examples=400, deadline=None)
@given(st.lists(samples | values, max_size=4), st.sampled_from([None, 1, 2, True, 1.0, "1"]))
def test_fuzz_fast_path_agrees_with_the_general_path(items: list[Any], version: Any) -> None:
    doc: dict[str, Any] = {"metrics": items}
    if version is not None:
        doc["schema_version"] = version
    try:
        raw = orjson.dumps(doc)
    except TypeError:   # an integer orjson cannot write: not a record a producer could send
        return
    assert_alike(raw)
