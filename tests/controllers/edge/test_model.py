"""The edge-weight domain model: validation names field and value; records round-trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opsloop.controllers.edge.model import Listener, Topology
from opsloop.records import EdgeWeights, Mode


def _record(**overrides):
    doc = {"version": 3, "listener": "192.0.2.10:443", "edge": "ams",
           "weights": {"eu": 0.9, "us-east": 0.1}, "computed_at": 1795310400.0,
           "mode": "normal", "reason": "optimal", "inputs_age_s": 4.0, "shed": {}}
    doc.update(overrides)
    return doc


def test_amsterdam_example_round_trips():
    # "Building A Smarter AWS Global Accelerator": "Edge node Amsterdam: EU DC 90 %, US-EAST DC 10 %"
    rec = EdgeWeights.model_validate(_record(weights={"eu": 0.9, "us-west": 0.0, "us-east": 0.1,
                                                      "asia": 0.0}))
    back = EdgeWeights.decode(rec.encode())
    assert back == rec
    assert back.weights["eu"] == pytest.approx(0.9)
    assert back.mode is Mode.NORMAL


@pytest.mark.parametrize("weights, needle", [
    ({"eu": 0.9, "us": 0.2}, "sum to 1"),
    ({"eu": 1.5, "us": -0.5}, "weights['eu']"),
    ({"eu": float("nan"), "us": 1.0}, "weights['eu']"),
    ({"eu": 0.0, "us": 0.0}, "sum to 1"),
    ({}, "weights"),
])
def test_bad_shares_name_the_field_and_value(weights, needle):
    with pytest.raises(ValidationError) as err:
        EdgeWeights.model_validate(_record(weights=weights))
    assert needle in str(err.value)


def test_negative_version_and_unknown_schema_are_rejected():
    with pytest.raises(ValidationError, match="version"):
        EdgeWeights.model_validate(_record(version=-1))
    with pytest.raises(ValidationError, match="schema_version: unsupported version 7"):
        EdgeWeights.model_validate(_record(schema_version=7))
    with pytest.raises(ValidationError, match=r"shed\['rps'\]"):
        EdgeWeights.model_validate(_record(shed={"rps": -3.0}))


@pytest.mark.parametrize("raw, needle", [(b"not json", "not JSON"), (b"[1, 2]", "JSON object"),
                                         (b"{}", "Field required")])
def test_decode_bad_records(raw, needle):
    with pytest.raises(ValueError, match=needle):
        EdgeWeights.decode(raw)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children,
                                                                      max_size=4),
    max_leaves=12)
_record_like = st.fixed_dictionaries(
    {}, optional={key: _json_values for key in _record()}).map(lambda d: json.dumps(d).encode())


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200), _record_like))
def test_decode_fuzz_only_raises_value_errors(raw):
    try:
        rec = EdgeWeights.decode(raw)
    except ValueError:  # pydantic's ValidationError is a ValueError too
        return
    assert math.isclose(math.fsum(rec.weights.values()), 1.0, abs_tol=1e-6)


def _topology(**overrides):
    doc = {"listener": {"name": "192.0.2.10:443", "edges": [{"name": "ams"}, {"name": "nyc"}],
                        "origins": [{"name": "eu", "capacity_rps": 500},
                                    {"name": "us-east", "capacity_rps": 800, "healthy": False}]},
           "latency_ms": {"ams": {"eu": 10, "us-east": 80}, "nyc": {"us-east": 8}},
           "demand_rps": {"ams": 300, "nyc": 120}}
    doc.update(overrides)
    return doc


def test_topology_to_arrays():
    demand, capacity, latency, healthy = Topology.model_validate(_topology()).arrays()
    assert demand.tolist() == [300, 120]
    assert capacity.tolist() == [500, 800]
    assert healthy.tolist() == [True, False]
    assert latency[0].tolist() == [10, 80]
    assert math.isinf(latency[1, 0]) and latency[1, 1] == 8  # missing pair = no path


@pytest.mark.parametrize("overrides, needle", [
    ({"latency_ms": {"ams": {"mars": 10}}}, "unknown origin 'mars'"),
    ({"latency_ms": {"lhr": {"eu": 10}}}, "unknown edge 'lhr'"),
    ({"latency_ms": {"ams": {"eu": -4}}}, "latency_ms['ams']['eu']: expected a finite number >= 0, got -4"),
    ({"demand_rps": {"ams": float("nan")}}, "demand_rps['ams']"),
    ({"demand_rps": {"ams": -1}}, "got -1"),
])
def test_topology_errors_name_field_and_value(overrides, needle):
    with pytest.raises(ValidationError) as err:
        Topology.model_validate(_topology(**overrides))
    assert needle in str(err.value)


def test_listener_rejects_duplicates_and_negative_capacity():
    with pytest.raises(ValidationError, match="duplicate name"):
        Listener.model_validate({"name": "l", "edges": [{"name": "a"}, {"name": "a"}],
                                 "origins": [{"name": "o", "capacity_rps": 1}]})
    with pytest.raises(ValidationError) as err:
        Listener.model_validate({"name": "l", "edges": [{"name": "a"}],
                                 "origins": [{"name": "o", "capacity_rps": -5}]})
    assert "capacity_rps" in str(err.value) and "-5" in str(err.value)
    assert np.isfinite(500.0)
