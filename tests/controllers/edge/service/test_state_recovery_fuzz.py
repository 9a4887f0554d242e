"""What the edge control service recovers at start, valid in shape but holding adversarial values, one field
at a time (or torn at every byte offset); then the real service's pieces start on it and run a few ticks.

* The last decision per edge, recovered from ``edge.weights`` (``recover_decisions`` over an in-process
  broker, kafka-python's own futures): a record with NaN (as raw text), huge and negative numbers,
  integers beyond 64 bits, an epoch beyond the year 9999 in ms, shares off their sum, unknown origins,
  wrong types, unicode, a record cut at every byte offset.
* The operator's API overrides file (``overrides.py``), with the same kinds of values in each field.

Then ``ControlLoop`` ticks with demand from every edge, publishing through the real ``DecisionPublisher``,
and the API's status, weights and topology reads are encoded as the server encodes them.

The property: the record (or file) is refused by name -- the record skipped and logged with its offset and
why, the file stopping the start with an ``OverridesError`` naming it (the service never starts without the
operator's drains) -- or its values are used; never a tick that fails (``error``, ``publish_failed``), never
a record the actuators would refuse (an epoch beyond the year 9999 in ms, a version beyond 2**63 - 1, weights
that are no distribution), never a read of the status that cannot be encoded. And the file takes exactly
the values the API takes for the same field.

What failed before (kept as examples below): a recovered record with version or epoch 2**64 - 1 (valid to
the schema) made every record after it carry 2**64, which orjson cannot encode: every publish failed, for
good; one with an epoch beyond the year 9999 in ms made every record one the actuators now refuse. An
overrides file read leniently took a capacity ``true`` as 1 req/s, ``"5"`` as 5, and a pin ``"false"`` or
``0`` as a drain: values the API refuses.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from opsloop.audit.trail import AuditLog
from opsloop.controllers.edge.service import kafka_io
from opsloop.controllers.edge.service.api import EdgeApi
from opsloop.controllers.edge.service.inputs import DemandBook
from opsloop.controllers.edge.service.kafka_io import DecisionPublisher, recover_decisions
from opsloop.controllers.edge.service.loop import ControlLoop
from opsloop.controllers.edge.service.overrides import OverridesError
from opsloop.controllers.edge.service.store import TopologyStore
from opsloop.controllers.edge.settings import ControllerSettings
from opsloop.records import EdgeDemand, EdgeWeights, OriginState
from tests.controllers.edge.service.test_schedule_loop import (BACKEND, EDGES, LISTENER, ORIGINS, T0, WEIGHTS_TOPIC,
                                                               Broker, FakeProducer, FakeTopicConsumer, topology)
from tests.helpers import captured_logs

# what the actuators take (controllers/actuators/store.py): spelt out, these tests run on the code before them
LAST_EPOCH = 253_402_300_799_999       # 9999-12-31T23:59:59.999Z in ms
MAX_VERSION = 2 ** 63 - 1
TOKEN = "t" * 32
AUTH = f"Bearer {TOKEN}"
HOLE = orjson.dumps("\u0000hole")      # where the raw value goes (a string no field holds)
GOOD = {"version": 7, "epoch": int(T0 * 1000) - 60_000, "listener": LISTENER, "edge": "e1",
        "weights": {"near": 0.5, "mid": 0.5}, "computed_at": T0 - 5, "mode": "normal", "reason": "recovered",
        "inputs_age_s": 0.0, "shed": {}}

NUMBERS = ["1e400", "-1e400", "NaN", "Infinity", "1e300", "-1e300", "-1e13", "1e13", "-1", "0", "1.5", "1e-300",
           "253402300799999", "253402300800000", "9007199254740992", "9007199254740993", "9223372036854775807",
           "9223372036854775808", "18446744073709551615", "18446744073709551616", "-9223372036854775809"]
OTHERS = ['"5"', '""', '"\\u00e9\\u2603\\ud83d\\ude00"', "true", "false", "null", "[]", "{}", "[1, 2]", '"e9"',
          '"hold"', '"panic"']
SHARES = ['{"near": 1.0}', '{"near": 0.6, "mid": 0.6}', '{"near": -0.5, "mid": 1.5}', '{"near": 1e-300, "mid": 1.0}',
          '{"near": 1.0, "zz": 0.0}', '{"zz": 1.0}', '{"near": 0.0, "mid": 0.0, "far": 1.0}', '{"near": "1"}',
          '{"near": true}', '{"": 1.0}', '{"rps": 1e300}', '{"rps": -1}']
RAW = st.one_of(st.sampled_from(NUMBERS + OTHERS + SHARES), st.integers(-2 ** 70, 2 ** 70).map(str),
                st.floats(allow_nan=False, allow_infinity=False).map(lambda f: orjson.dumps(f).decode()))


def with_raw(doc: dict[str, Any], name: str, raw: str) -> bytes:
    out = orjson.dumps({**doc, name: "\u0000hole"}).replace(HOLE, raw.encode("utf-8", "surrogatepass"))
    assert HOLE not in out
    return out


def run_service(broker: Broker, clock: list[float], store: TopologyStore) -> dict[tuple[str, str], EdgeWeights]:
    """Recover, start the loop and the API, tick with demand from every edge; check the property; the recovered."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kafka_io, "service_producer", lambda kafka, client_id, **kw: FakeProducer(broker, **kw))
        mp.setattr(kafka_io, "KafkaConsumer", lambda **kw: FakeTopicConsumer(broker, **kw))
        recovered = recover_decisions("127.0.0.1:9", topic=WEIGHTS_TOPIC, timeout_s=5.0)
        publisher = DecisionPublisher("127.0.0.1:9", flush_timeout_s=1.0)
        book = DemandBook(max_clock_skew_s=5.0, clock=lambda: clock[0])
        loop = ControlLoop(store, book, ControllerSettings(interval_s=10.0, stale_after_s=30.0), publisher,
                           recovered, clock=lambda: clock[0])
        api = EdgeApi(store, TOKEN, loop.status, loop.weights)
        published = len(broker.topic(WEIGHTS_TOPIC))
        for i in range(4):
            clock[0] += 10.0
            for e in EDGES:
                book.update(EdgeDemand(edge=e, backend=BACKEND, demand_rps=40.0 + 10 * i,
                                       origins={o: OriginState(rps=5.0) for o in ORIGINS}, timestamp=clock[0]))
            loop.tick()
            tick = loop.status()[LISTENER]["last_tick"]
            failure = loop.status()[LISTENER]["publish_failure"]
            assert tick["outcome"] not in ("error", "publish_failed"), (tick, failure)
            for path in ("/v1/status", f"/v1/listeners/{LISTENER}/weights", "/v1/topology"):
                status, doc = api.dispatch("GET", path, AUTH, b"")
                assert status == 200, (path, doc)
                orjson.dumps(doc)   # what the server sends: an int beyond 64 bits made every read a 500
        newest = max((r.epoch for r in recovered.values()), default=-1)
        records = [EdgeWeights.decode(v) for _, v in broker.topic(WEIGHTS_TOPIC)[published:]]
        assert records, "nothing published"
        for rec in records:   # decodes (shares a distribution), and is one the actuators take
            assert newest < rec.epoch <= LAST_EPOCH and 0 <= rec.version <= MAX_VERSION, (rec.epoch, rec.version)
        return recovered


# -- the recovered decision ------------------------------------------------------------------------------------
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(GOOD)), raw=RAW, older=st.booleans())
@example(name="version", raw="18446744073709551615", older=False)    # every publish failed, for good
@example(name="epoch", raw="18446744073709551615", older=True)       # the same through the epoch
@example(name="epoch", raw="253402300799999", older=False)           # every record beyond what actuators take
@example(name="epoch", raw="9223372036854775807", older=False)
def test_a_recovered_decision_with_any_value_in_a_field_is_skipped_by_name_or_used(name: str, raw: str,
                                                                                   older: bool) -> None:
    clock = [T0]
    broker = Broker(clock)
    if older:   # an earlier record of the key: what recovery keeps when the newest cannot be used
        broker.append(WEIGHTS_TOPIC, f"{LISTENER}|e1".encode(), orjson.dumps({**GOOD, "version": 3}))
    bad = with_raw(GOOD, name, raw)
    broker.append(WEIGHTS_TOPIC, f"{LISTENER}|e1".encode(), bad)
    offset = len(broker.topic(WEIGHTS_TOPIC)) - 1
    with captured_logs() as logs:
        recovered = run_service(broker, clock, TopologyStore(topology(), AuditLog()))
    try:
        decoded: EdgeWeights | None = EdgeWeights.decode(bad)
    except ValueError:
        decoded = None
    kept = recovered.get((decoded.listener, decoded.edge)) if decoded is not None else None
    if decoded is None or kept != decoded:   # not used: superseded by a later stamp, or skipped and said so
        superseded = decoded is not None and kept is not None and kept.stamp > decoded.stamp
        assert superseded or any("recover_record_rejected" in line and f"'offset': {offset}" in line
                                 for line in logs.lines), logs.lines[:5]


@pytest.mark.parametrize("cut", range(0, len(orjson.dumps(GOOD)), 7))
def test_a_recovered_decision_cut_short_is_skipped(cut: int) -> None:
    clock = [T0]
    broker = Broker(clock)
    broker.append(WEIGHTS_TOPIC, f"{LISTENER}|e1".encode(), orjson.dumps(GOOD)[:cut])
    assert run_service(broker, clock, TopologyStore(topology(), AuditLog())) == {}


# -- the overrides file ------------------------------------------------------------------------------------------
FIELD_PATHS = {   # where in the file, and what the API is asked for the same value (None: no API for it)
    "capacity": (("capacity_rps", LISTENER, "near"), lambda s, v: s.set_capacity(LISTENER, "near", v)),
    "health": (("health", LISTENER, "mid"), lambda s, v: pin(s, v)),
    "latency": (("latency_ms", LISTENER, "e1", "far"),
                lambda s, v: s.set_latency(LISTENER, "e1", "far", math.inf if v is None else v)),
    "forced": (("health_forced", LISTENER), None),
    "version": (("version",), None),
    "capacity_unknown_origin": (("capacity_rps", LISTENER, "zz"), None),
}
BASE = {"version": 1, "capacity_rps": {LISTENER: {"far": 450.0}}, "health": {LISTENER: {"near": True}},
        "latency_ms": {LISTENER: {"e2": {"mid": 4.0}}}, "health_forced": {LISTENER: ["near"]}}


def pin(store: TopologyStore, value: Any) -> None:
    """The API's pin; its null (follow the checks) is no pin in the file, which has no null pin to hold."""
    if value is None:
        raise ValueError("null: no pin")
    store.set_health(LISTENER, "mid", value)


def overrides_text(where: tuple[str, ...], raw: str) -> str:
    doc: Any = json.loads(json.dumps(BASE))
    node = doc
    for key in where[:-1]:
        node = node.setdefault(key, {})
    node[where[-1]] = "\u0000hole"
    return json.dumps(doc).replace(json.dumps("\u0000hole"), raw)


def api_takes(change: Any, raw: str) -> bool:
    """Whether the API takes the value ``raw`` says (read as the file reads it) for the same field."""
    try:
        value = json.loads(raw)
    except ValueError:
        return False
    try:
        change(TopologyStore(topology(), AuditLog()), value)
    except (ValueError, OverflowError):   # TopologyError; a 10**400 the API's JSON parser refuses outright
        return False
    return True


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(FIELD_PATHS)), raw=RAW)
@example(field="capacity", raw="true")      # was a capacity of 1 req/s
@example(field="capacity", raw='"5"')       # was 5 req/s
@example(field="health", raw='"false"')     # was a drain
@example(field="health", raw="0")           # was a drain
def test_an_overrides_file_with_any_value_in_a_field_is_refused_by_name_or_used(field: str, raw: str) -> None:
    where, change = FIELD_PATHS[field]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "overrides.json"
        path.write_text(overrides_text(where, raw), encoding="utf-8", errors="surrogatepass")
        try:
            store = TopologyStore(topology(), AuditLog(), path)
        except OverridesError as e:
            assert str(path) in str(e) and "\n" not in str(e), str(e)
            if change is not None:
                assert not api_takes(change, raw), f"the file refused what the API takes: {e}"
            return
        if change is not None:
            assert api_takes(change, raw), f"the file took what the API refuses: {store.topology()}"
        clock = [T0]
        run_service(Broker(clock), clock, store)


def test_an_overrides_file_torn_at_every_byte_offset_stops_the_start_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "overrides.json"
    saved = TopologyStore(topology(), AuditLog(), path)
    saved.set_capacity(LISTENER, "near", 55.0)
    saved.set_health(LISTENER, "mid", True, force=True)
    saved.set_latency(LISTENER, "e1", "far", math.inf)
    whole = path.read_bytes()
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])
        with pytest.raises(OverridesError) as e:
            TopologyStore(topology(), AuditLog(), path)
        assert str(path) in str(e.value)
    path.write_bytes(whole)
    restored = TopologyStore(topology(), AuditLog(), path)
    assert restored.origin(LISTENER, "near")["capacity_rps"] == 55.0
    assert restored.origin(LISTENER, "mid")["health_forced"] is True
