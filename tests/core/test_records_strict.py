"""The records' numbers are numbers, their flags JSON bools, and a finding's ``where`` is bounded
(opsloop/records/base.py, finding.py, edge.py, audit.py, metric.py).

Before, pydantic's lax mode read JSON ``true`` as 1 and a string of digits as the number: ``"first_seen": true``
decoded as a finding of 1970, ``"version": true`` as weights version 1, ``{"weights": {"eu": true}}`` as a share of
1, ``"up": 0`` as a server down, ``"cleared": "true"`` as cleared; and a finding with 80,000 where-labels decoded,
for every consumer to pay for. Each is now refused at decode with one line naming the field and the value (the
style of the time and stamp bounds), which the consumers dead-letter and count. What the producers send still
decodes: ints where floats go, an integral float where an int goes, numpy's numbers from the controllers."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.audit.trail import AuditLog
from opsloop.controllers.actuators import metrics as actuator_metrics
from opsloop.controllers.actuators.config import ActuatorConfig
from opsloop.controllers.actuators.service import ActuatorService
from opsloop.controllers.paging import metrics as paging_metrics
from opsloop.controllers.paging.alertmanager import PostResult
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from opsloop.records import AuditRecord, EdgeDemand, EdgeWeights, Finding, JsonRecord, RecordError
from opsloop.records.metric import MAX_TAGS
from opsloop.wire import parse_record
from tests.helpers import SentRecords, unique

T0 = 1_795_310_400
# spelt out: these tests run on the records before they had the bounds
MAX_WHERE, MAX_WHERE_KEY, MAX_WHERE_VALUE, MAX_NAME_CHARS = 66, 256, 1024, 256

FINDING = {"detector": "firewall.unprotected_port", "what": "VM port without its security-group chain",
           "where": {"hypervisor": "hv-3", "port": "p1"}, "observed": "chain absent", "expected": "chain present",
           "score": 0.5, "first_seen": T0, "last_seen": T0 + 0.5, "cleared": False}
WEIGHTS = {"version": 7, "epoch": 1_800_000_000_000, "listener": "web", "edge": "ams1",
           "weights": {"near": 0.25, "far": 0.75}, "computed_at": 1_800_000_000.0, "inputs_age_s": 1.5,
           "shed": {"rps": 10.0, "fraction": 0.1}}
DEMAND = {"edge": "ams1", "backend": "web", "demand_rps": 12.5, "timestamp": T0,
          "origins": {"near": {"rps": 12.5, "up": True, "status": "UP", "rtime_ms": 3.0}}}
AUDIT = {"time": T0, "actor": "controller.edge", "action": "edge.weights.push", "target": "haproxy:ams1/web",
         "mode": "live", "result": "applied", "version": 42}
GOOD: dict[type[JsonRecord], dict[str, Any]] = {Finding: FINDING, EdgeWeights: WEIGHTS, EdgeDemand: DEMAND,
                                                AuditRecord: AUDIT}


def with_value(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with ``value`` at the dotted ``path`` (``origins.near.rps``)."""
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    node[last] = value
    return out


NUMBER, INTEGER, BOOLEAN = "a valid number", "a valid integer", "a valid boolean"
# (record, field, a value lax mode took, what the field should be): every one decoded before
REFUSED = [
    (Finding, "first_seen", True, NUMBER),            # was 1970-01-01T00:00:01
    (Finding, "last_seen", str(T0), NUMBER),
    (Finding, "score", True, NUMBER),
    (Finding, "score", "0.5", NUMBER),
    (Finding, "observed", True, "a number, a string or null"),   # was observed 1.0
    (Finding, "expected", False, "a number, a string or null"),
    (Finding, "cleared", 1, BOOLEAN),                  # was a clearing
    (Finding, "cleared", "true", BOOLEAN),
    (Finding, "cleared", 0, BOOLEAN),
    (Finding, "schema_version", True, INTEGER),        # was version 1
    (Finding, "schema_version", "1", INTEGER),
    (EdgeWeights, "version", True, INTEGER),           # was version 1
    (EdgeWeights, "version", "7", INTEGER),
    (EdgeWeights, "epoch", False, INTEGER),
    (EdgeWeights, "computed_at", True, NUMBER),
    (EdgeWeights, "computed_at", "1800000000", NUMBER),
    (EdgeWeights, "inputs_age_s", True, NUMBER),
    (EdgeWeights, "shed.rps", True, NUMBER),
    (EdgeWeights, "shed.fraction", "0.1", NUMBER),
    (EdgeWeights, "schema_version", True, INTEGER),
    (EdgeDemand, "demand_rps", True, NUMBER),
    (EdgeDemand, "demand_rps", "12.5", NUMBER),
    (EdgeDemand, "timestamp", str(T0), NUMBER),
    (EdgeDemand, "origins.near.rps", True, NUMBER),
    (EdgeDemand, "origins.near.up", 0, BOOLEAN),       # was a server down
    (EdgeDemand, "origins.near.up", "false", BOOLEAN),
    (EdgeDemand, "origins.near.rtime_ms", "3", NUMBER),
    (AuditRecord, "time", str(T0), NUMBER),
    (AuditRecord, "version", True, "an integer, a string or null"),   # was version 1
]


@pytest.mark.parametrize("cls, field, value, should", REFUSED,
                         ids=[f"{c.__name__}.{f}={v!r}" for c, f, v, _ in REFUSED])
def test_a_value_of_the_wrong_type_is_refused_at_decode_naming_the_field(cls: type[JsonRecord], field: str,
                                                                         value: Any, should: str) -> None:
    doc = with_value(GOOD[cls], field, value)
    with pytest.raises(RecordError) as decoded:
        cls.decode(orjson.dumps(doc))
    with pytest.raises(RecordError) as built:
        cls.build(**doc)
    expected = f"{cls.RECORD}: {field}: Input should be {should} (got {value!r})"
    assert str(decoded.value) == expected and str(built.value) == expected


def test_weights_of_true_are_no_share_of_one() -> None:
    """``{"near": true}`` summed to 1 and was a decision sending everything to ``near``."""
    doc = {**WEIGHTS, "weights": {"near": True}}
    with pytest.raises(RecordError) as e:
        EdgeWeights.decode(orjson.dumps(doc))
    assert str(e.value) == "edge weights record: weights.near: Input should be a valid number (got True)"
    with pytest.raises(RecordError, match=r"^edge weights record: weights\.near: Input should be a valid number "
                                          r"\(got '0\.25'\)$"):
        EdgeWeights.decode(orjson.dumps(with_value(WEIGHTS, "weights.near", "0.25")))


def test_every_wrong_type_is_named_in_one_error() -> None:
    with pytest.raises(RecordError, match=r"^finding: score: .*; first_seen: .*; cleared: "):
        Finding.decode(orjson.dumps({**FINDING, "score": True, "first_seen": "1", "cleared": 1}))


# -- what the producers send still decodes, as before -------------------------------------------------
@pytest.mark.parametrize("cls, field, value, read", [
    (Finding, "first_seen", T0, float(T0)),            # an int where a float goes
    (Finding, "score", 1, 1.0),
    (Finding, "observed", 3, 3.0),
    (Finding, "observed", "3", "3"),                   # a string reading stays a string
    (Finding, "expected", None, None),
    (Finding, "schema_version", 1.0, 1),               # an integral float where an int goes
    (EdgeWeights, "version", 7.0, 7),
    (EdgeWeights, "epoch", 0.0, 0),
    (EdgeWeights, "computed_at", 1_800_000_000, 1_800_000_000.0),
    (EdgeWeights, "inputs_age_s", 0, 0.0),
    (EdgeDemand, "demand_rps", 12, 12.0),
    (EdgeDemand, "timestamp", T0, float(T0)),
    (AuditRecord, "time", T0, float(T0)),
    (AuditRecord, "version", 42.0, 42),
    (AuditRecord, "version", "42", "42"),              # a version given as text stays text (its _source)
    (AuditRecord, "version", None, None),
])
def test_numbers_producers_send_still_decode(cls: type[JsonRecord], field: str, value: Any, read: Any) -> None:
    record = cls.decode(orjson.dumps(with_value(GOOD[cls], field, value)))
    got = getattr(record, field)
    assert got == read and type(got) is type(read)
    assert cls.decode(record.encode()) == record


def test_ints_for_floats_inside_collections_still_decode() -> None:
    weights = EdgeWeights.decode(orjson.dumps({**WEIGHTS, "weights": {"near": 1, "far": 0}, "shed": {"rps": 3}}))
    assert weights.weights == {"near": 1.0, "far": 0.0} and weights.shed == {"rps": 3.0}
    demand = EdgeDemand.decode(orjson.dumps(with_value(DEMAND, "origins.near", {"rps": 12, "rtime_ms": 3})))
    assert demand.origins["near"].rps == 12.0 and demand.origins["near"].rtime_ms == 3.0


def test_numpy_numbers_from_the_controllers_still_build() -> None:
    """The edge controller and the detectors compute with numpy: pydantic's strict int refuses np.int64, so the
    integer fields refuse only bools and text."""
    weights = EdgeWeights(version=np.int64(3), epoch=np.int64(5), listener="web", edge="ams1",
                          weights={"near": np.float64(0.25), "far": np.float32(0.75)}, computed_at=np.float64(T0),
                          inputs_age_s=np.float64(0.5), shed={"rps": np.float64(1.0)})
    assert weights.stamp == (5, 3) and EdgeWeights.decode(weights.encode()) == weights
    finding = Finding(**{**FINDING, "score": np.float64(0.25), "observed": np.float64(1.5),
                         "first_seen": np.float64(T0), "last_seen": np.int64(T0)})
    assert finding.observed == 1.5 and Finding.decode(finding.encode()) == finding


# -- telemetry samples: the stream stage dead-letters a bad one, keeps the good ------------------------
def test_a_sample_with_its_timestamp_as_a_string_is_rejected_and_the_good_one_kept() -> None:
    good = {"name": "ipmi_power", "tags": {"host": "h1"}, "fields": {"watts": 155.0}, "timestamp": T0}
    bad = {**good, "timestamp": str(T0)}
    parsed = parse_record(orjson.dumps({"schema_version": 1, "metrics": [good, bad]}))
    assert [m.timestamp for m in parsed.metrics] == [float(T0)]
    assert [r.reason for r in parsed.rejected] == [f"metrics.1.timestamp: Input should be a valid number "
                                                   f"(got '{T0}')"]
    single = parse_record(orjson.dumps(bad))
    assert not single.metrics and single.rejected[0].reason.startswith("timestamp: Input should be a valid number")
    fast = parse_record(orjson.dumps({"schema_version": 1, "metrics": [good, {**good, "timestamp": T0 + 1.5}]}))
    assert [m.timestamp for m in fast.metrics] == [float(T0), T0 + 1.5] and not fast.rejected


# -- a finding's where ----------------------------------------------------------------------------------
def finding_doc(where: Any) -> dict[str, Any]:
    return {**FINDING, "where": where}


def test_the_largest_where_a_detector_writes_round_trips() -> None:
    """The anomaly detector's where: a sample's whole tag set (at most MAX_TAGS), names and values cut to 256
    characters by the stream stage, plus metric and field."""
    where = {f"{i:03d}".ljust(MAX_WHERE_KEY, "k"): f"{i:03d}".ljust(256, "v") for i in range(MAX_TAGS)}
    where.update(metric="ipmi_power", field="watts")
    assert len(where) == MAX_WHERE
    f = Finding.decode(orjson.dumps(finding_doc(where)))
    assert f.where == where and Finding.decode(f.encode()) == f
    long_value = Finding.decode(orjson.dumps(finding_doc({"host": "h" * MAX_WHERE_VALUE})))
    assert long_value.where["host"] == "h" * MAX_WHERE_VALUE


@pytest.mark.parametrize("where, message", [
    ({f"k{i}": "v" for i in range(MAX_WHERE + 1)}, f"{MAX_WHERE + 1} labels, at most {MAX_WHERE}"),
    ({f"k{i}": "v" for i in range(80_000)}, f"80000 labels, at most {MAX_WHERE}"),     # the poison record
    ({"k" * (MAX_WHERE_KEY + 1): "v"},
     f"label name '{'k' * 76}...: {MAX_WHERE_KEY + 1} characters, at most {MAX_WHERE_KEY}"),
    ({"host": "h1", "vm": "v" * (MAX_WHERE_VALUE + 1)},
     f"label 'vm': value of {MAX_WHERE_VALUE + 1} characters, at most {MAX_WHERE_VALUE}"),
    ({"k" * 100_000: "v"}, f"label name '{'k' * 76}...: 100000 characters, at most {MAX_WHERE_KEY}"),
    ({"host": "h1", "port": 443}, "label 'port': expected a string, got 443"),
])
def test_a_where_beyond_its_bounds_is_refused_at_decode_naming_it(where: dict[str, str], message: str) -> None:
    with pytest.raises(RecordError) as decoded:
        Finding.decode(orjson.dumps(finding_doc(where)))
    with pytest.raises(RecordError) as built:
        Finding.build(**finding_doc(where))
    assert str(decoded.value) == str(built.value) == f"finding: where: {message}"


_KEYS = st.one_of(st.text(st.characters(codec="utf-8"), max_size=6),
                  st.integers(MAX_WHERE_KEY - 2, MAX_WHERE_KEY + 2).map(lambda n: "k" * n))
_VALUES = st.one_of(st.text(st.characters(codec="utf-8"), max_size=6),
                    st.integers(MAX_WHERE_VALUE - 2, MAX_WHERE_VALUE + 2).map(lambda n: "v" * n),
                    st.integers(-3, 3), st.booleans(), st.none(), st.floats(0, 1))
_WHERES = st.one_of(st.dictionaries(_KEYS, _VALUES, max_size=8),
                    st.integers(MAX_WHERE - 3, MAX_WHERE + 3).flatmap(
                        lambda n: st.dictionaries(_KEYS, st.just("v"), min_size=n, max_size=n)))


@settings(max_examples=300, deadline=None)
@given(_WHERES)
def test_a_where_is_taken_exactly_when_it_is_within_its_bounds(where: dict[str, Any]) -> None:
    fits = (len(where) <= MAX_WHERE and all(len(k) <= MAX_WHERE_KEY for k in where)
            and all(isinstance(v, str) and len(v) <= MAX_WHERE_VALUE for v in where.values()))
    raw = orjson.dumps(finding_doc(where))
    if fits:
        f = Finding.decode(raw)
        assert f.where == where and Finding.decode(f.encode()) == f
    else:
        with pytest.raises(RecordError) as e:
            Finding.decode(raw)
        message = str(e.value)
        assert message.startswith("finding: where: ") and "\n" not in message and len(message) < 200, message


# -- the edge records' names ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls, field", [(EdgeWeights, "listener"), (EdgeWeights, "edge"), (EdgeDemand, "edge"),
                                        (EdgeDemand, "backend")])
def test_a_name_is_at_most_256_characters(cls: type[JsonRecord], field: str) -> None:
    name = "n" * MAX_NAME_CHARS
    assert getattr(cls.decode(orjson.dumps({**GOOD[cls], field: name})), field) == name
    with pytest.raises(RecordError, match=rf"^{cls.RECORD}: {field}: String should have at most {MAX_NAME_CHARS} "
                                          r"characters \(got 'nnn"):
        cls.decode(orjson.dumps({**GOOD[cls], field: name + "n"}))


def test_an_origin_name_is_at_most_256_characters() -> None:
    name = "o" * MAX_NAME_CHARS
    assert EdgeWeights.decode(orjson.dumps({**WEIGHTS, "weights": {name: 1.0}})).weights == {name: 1.0}
    too_long = r"o+\.\.\.\(257 chars\)\.\[key\]: String should have at most"   # the key shortened in the path
    with pytest.raises(RecordError, match=r"^edge weights record: weights\." + too_long):
        EdgeWeights.decode(orjson.dumps({**WEIGHTS, "weights": {name + "o": 1.0}}))
    origins = {name + "o": DEMAND["origins"]["near"]}
    with pytest.raises(RecordError, match=r"^edge demand record: origins\." + too_long):
        EdgeDemand.decode(orjson.dumps({**DEMAND, "origins": origins}))


# -- the consumers dead-letter and count such a record, and take the good one beside it -----------------
class Alertmanager:
    def post(self, alerts: list[dict[str, Any]]) -> PostResult:
        return PostResult(accepted=len(alerts))

    def close(self) -> None:
        pass


def test_the_paging_actuator_dead_letters_a_finding_of_the_wrong_type(tmp_path: Path) -> None:
    """A finding ``"first_seen": true`` was paged as starting in 1970."""
    producer = SentRecords()
    svc = PagingService(PagingConfig(state_file=tmp_path / "state.json", start_offset="latest"), "127.0.0.1:1",
                        consumer=object(), producer=producer, client=Alertmanager())  # type: ignore[arg-type]
    good = Finding(**{**FINDING, "severity": "critical"})
    bad = orjson.dumps({**FINDING, "severity": "critical", "where": {"hypervisor": "hv-4"}, "first_seen": True})
    before = paging_metrics.REJECTED._value.get()
    actions = svc.handle_records([bad, good.encode()], T0 + 1, [(0, 1, b"k1"), (0, 2, b"k2")])
    assert [(a.kind, a.finding_id) for a in actions] == [("open", good.id)]
    assert paging_metrics.REJECTED._value.get() - before == 1
    (dead,) = producer.deadletters()
    assert dead["reason"] == "finding: first_seen: Input should be a valid number (got True)"
    assert (dead["offset"], dead["key"], dead["value"]) == (1, "k1", bad.decode())


def test_the_weight_actuators_dead_letter_weights_of_the_wrong_type(tmp_path: Path) -> None:
    """``{"near": true}`` was a newer decision sending every request to ``near``."""
    edge = unique("strict")
    cfg = ActuatorConfig(stale_after_s=10.0, store_dir=tmp_path,
                         targets=[{"edge": edge, "listener": "web", "kind": "haproxy",
                                   "socket": str(tmp_path / "none.sock"), "backend": "be",
                                   "servers": {"near": "near", "far": "far"}}])
    producer = SentRecords()
    svc = ActuatorService(cfg, "127.0.0.1:1", [edge], AuditLog([]), consumer=object(), producer=producer)
    key = f"web|{edge}".encode()
    good = EdgeWeights(version=2, listener="web", edge=edge, weights={"near": 0.5, "far": 0.5},
                       computed_at=time.time()).encode()
    bad = orjson.dumps({**orjson.loads(good), "version": 3, "weights": {"near": True}})
    before = actuator_metrics.REJECTED._value.get()
    assert svc.handle_records([(key, bad), (key, good)], [(3, 100), (3, 101)]) == 1
    pending = svc.slots[("web", edge)].pending
    assert pending is not None and pending.version == 2 and pending.weights == {"near": 0.5, "far": 0.5}
    assert actuator_metrics.REJECTED._value.get() - before == 1
    (dead,) = producer.deadletters()
    assert dead["reason"] == "edge weights record: weights.near: Input should be a valid number (got True)"
    assert (dead["offset"], dead["stage"], dead["value"]) == (100, "actuator", bad.decode())
