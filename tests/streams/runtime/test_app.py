"""The Faust app factory: settings that reach Faust's consumer, one decode per topic for several handlers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Sequence

import pytest

from opsloop.config import load_settings
from opsloop.records import Metric, metric
from opsloop.streams.runtime import health
from opsloop.streams.runtime.app import create_app
from opsloop.streams.runtime.batch import FanOut


def _settings(tmp_path: Path, **stream: Any):
    return load_settings(None, {"stream": {"data_dir": str(tmp_path / "streams"), **stream}})


@pytest.mark.parametrize("wait_ms", [40, 250])
def test_the_consumer_fetch_wait_comes_from_the_settings(tmp_path: Path, wait_ms: int) -> None:
    # Faust fixes 1500 ms; streams/runtime/transport.py replaces it. This breaks loudly if a Faust or
    # aiokafka upgrade moves the place where the consumer is created or where it keeps the value.
    app = create_app(_settings(tmp_path, fetch_max_wait_ms=wait_ms), app_id="t-fetch-wait")

    async def build() -> Any:
        return app.consumer._thread._create_worker_consumer(app.transport)

    consumer = asyncio.run(build())
    assert consumer._fetch_max_wait_ms == wait_ms


def test_fetch_wait_is_validated(tmp_path: Path) -> None:
    from opsloop.config import ConfigError

    with pytest.raises(ConfigError, match="fetch_max_wait_ms"):
        _settings(tmp_path, fetch_max_wait_ms=0)


class _Recorder:
    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail, self.seen = name, fail, []  # type: tuple[str, bool, list[int]]

    def handle(self, metrics: Sequence[Metric], now: float) -> None:
        self.seen.append(len(metrics))
        if self.fail:
            raise ValueError("boom")


def test_fan_out_feeds_every_handler_in_order_and_names_the_failed_one() -> None:
    first, broken, last = _Recorder("first"), _Recorder("broken", fail=True), _Recorder("last")
    batch = [metric("haproxy", {"stot": i}, {"host": "lb"}, 1_795_000_000.0 + i) for i in range(3)]
    errors = health.ERRORS.labels("broken")
    before = errors._value.get()
    with pytest.raises(RuntimeError, match=r"broken: ValueError: boom"):
        FanOut("lb", [first, broken, last]).handle(batch, 0.0)
    assert first.seen == [3] and last.seen == [3]   # the failure did not keep "last" from the batch
    assert errors._value.get() == before + 1


class _Named(_Recorder):
    def __init__(self, name: str, names: frozenset[str] | None) -> None:
        super().__init__(name)
        self.names = names
        self.got: list[list[str]] = []

    def handle(self, metrics: Sequence[Metric], now: float) -> None:
        self.got.append([f"{m.name}:{m.fields['v']}" for m in metrics])


def test_fan_out_gives_each_handler_the_samples_of_its_names_in_batch_order() -> None:
    batch = [metric(n, {"v": i}, {"host": "h"}, 1_795_000_000.0) for i, n in enumerate(["a", "b", "c", "a", "b"])]
    only_a, a_and_b, every, none_here = (_Named("a", frozenset({"a"})), _Named("ab", frozenset({"a", "b"})),
                                        _Named("all", None), _Named("z", frozenset({"z"})))
    fan = FanOut("t", [only_a, a_and_b, every, none_here])
    fan.handle(batch, 0.0)
    fan.handle(batch[2:3], 0.0)   # routes are cached per name: a second batch is split the same way
    assert only_a.got == [["a:0", "a:3"], []]
    assert a_and_b.got == [["a:0", "b:1", "a:3", "b:4"], []]   # interleaved names keep the batch's order
    assert every.got == [["a:0", "b:1", "c:2", "a:3", "b:4"], ["c:2"]]
    assert none_here.got == [[], []]   # still called: a handler expires its state on every batch


def test_decode_and_handle_splits_while_decoding_as_fan_out_splits_the_decoded_batch() -> None:
    import orjson

    from bench.stream_workload import Msg
    from opsloop.streams.runtime.batch import decode_and_handle, decode_messages

    t = 1_795_000_000.0

    def sample(name: str, v: Any, ts: float = t) -> dict[str, Any]:
        return {"name": name, "tags": {"host": "h"}, "fields": {"v": v}, "timestamp": ts}

    records = [{"metrics": [sample("a", 0), sample("b", 1), sample("a", 2)]},
               {"metrics": [sample("c", 3), sample("a", "4"), {"name": "a", "fields": {}}]},  # one bad
               {"metrics": [sample("b", 5), sample("a", 6, ts=4_000_000_000.0)]},   # one from the future
               sample("a", 7)]                                                      # a single sample
    msgs = [Msg("t", 0, i, b"k", orjson.dumps(r)) for i, r in enumerate(records)]
    during, after = ([_Named("a", frozenset({"a"})), _Named("ab", frozenset({"a", "b"})), _Named("all", None)]
                     for _ in range(2))
    batch = decode_and_handle("t", msgs, FanOut("t", during))
    FanOut("t", after).handle(decode_messages(msgs).metrics, 0.0)
    assert [h.got for h in during] == [h.got for h in after]
    assert during[0].got == [["a:0", "a:2", "a:4", "a:7"]]
    assert during[1].got == [["a:0", "b:1", "a:2", "a:4", "b:5", "a:7"]]
    assert len(batch.deadletters) == 2   # the bad and the future sample, one dead letter per record


def test_fan_out_applies_a_handlers_name_filter_to_that_name_only() -> None:
    even = _Named("even-a", frozenset({"a", "b"}))
    even.name_filters = {"a": lambda m: m.fields["v"] % 2 == 0}   # type: ignore[attr-defined]
    every = _Named("all", None)
    batch = [metric(n, {"v": i}, {"host": "h"}, 1_795_000_000.0) for i, n in enumerate(["a", "a", "b", "b", "a"])]
    FanOut("t", [even, every]).handle(batch, 0.0)
    assert even.got == [["a:0", "b:2", "b:3", "a:4"]]
    assert every.got == [["a:0", "a:1", "b:2", "b:3", "a:4"]]


def test_a_name_filter_that_raises_dead_letters_the_batch_like_a_failing_handler() -> None:
    import orjson

    from bench.stream_workload import Msg
    from opsloop.streams.runtime.batch import decode_and_handle

    broken = _Named("broken", frozenset({"a"}))

    def boom(m: Metric) -> bool:
        raise KeyError("no such tag")

    broken.name_filters = {"a": boom}   # type: ignore[attr-defined]
    every = _Named("all", None)
    doc = {"metrics": [{"name": "a", "tags": {}, "fields": {"v": 1}, "timestamp": 1_795_000_000.0}]}
    batch = decode_and_handle("t", [Msg("t", 0, 0, b"k", orjson.dumps(doc))], FanOut("t", [broken, every]))
    assert [dl.reason for dl in batch.deadletters] == ["handler t failed: KeyError: 'no such tag'"]
    assert broken.got == [] and every.got == []
    with pytest.raises(KeyError):   # outside decode_and_handle, FanOut.handle raises it
        FanOut("t", [broken, every]).handle(batch.metrics, 0.0)


@pytest.mark.parametrize("key,value,headers", [(b"lb1", b'{"metrics": []}', []), (None, b"x", [("h", b"1")]),
                                               (b"k", None, None), (b"", b"", [])])
def test_raw_topics_decode_a_record_as_faust_s_raw_codec_does(tmp_path: Path, key: Any, value: Any,
                                                               headers: Any) -> None:
    # RawSchema skips Faust's codec lookup per record; the event must be the one Faust's decode builds.
    import faust
    from faust.types.tuples import ConsumerMessage

    from opsloop.streams.runtime.app import RawSchema, raw_topic

    app = create_app(_settings(tmp_path), app_id="t-raw-schema")
    ours = raw_topic(app, "telemetry.lb")
    faust_s = app.topic("telemetry.lb", schema=faust.Schema(key_serializer="raw", value_serializer="raw"))
    assert isinstance(ours.schema, RawSchema) and not isinstance(faust_s.schema, RawSchema)
    msg = ConsumerMessage("telemetry.lb", 3, 17, 0.0, 0, headers, key, value, None, None)
    mine, theirs = asyncio.run(ours.decode(msg, propagate=True)), asyncio.run(faust_s.decode(msg, propagate=True))
    assert (mine.key, mine.value, mine.headers, mine.message) == (theirs.key, theirs.value, theirs.headers, msg)
    assert ours.prepare_key(b"k", None) == faust_s.prepare_key(b"k", None)   # sending: the raw codec as before
    assert ours.prepare_value(b"v", None) == faust_s.prepare_value(b"v", None)
