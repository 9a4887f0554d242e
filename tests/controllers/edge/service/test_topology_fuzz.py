"""The topology file fuzzed: documents of the topology's shape with names and numbers of every kind (empty,
too long, NaN, infinite, huge, bools, strings, null), written as YAML and loaded as `opsloop edge` loads
them: a TopologySpec or a one-line ConfigError naming the file, never another exception (a validator that
raised TypeError or KeyError would have been a traceback at start)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from opsloop.config import ConfigError
from opsloop.controllers.edge.service.config import TopologySpec, load_topology

NAMES = st.sampled_from(["a", "b", "e1", "e2", "near", "far", "", " ", "x" * 201])
NUMBERS = st.one_of(st.floats(), st.integers(-10 ** 30, 10 ** 30), st.booleans(), st.text(max_size=3), st.none())
ORIGIN = st.fixed_dictionaries({"name": NAMES}, optional={"capacity_rps": NUMBERS, "healthy": NUMBERS,
                                                         "latency_ms": NUMBERS, "weight": NUMBERS})
EDGE = st.fixed_dictionaries({"name": NAMES}, optional={"lb": st.one_of(NAMES, st.none())})
LISTENER = st.fixed_dictionaries(
    {"name": NAMES, "edges": st.lists(EDGE, max_size=3), "origins": st.lists(ORIGIN, max_size=3)},
    optional={"latency_ms": st.dictionaries(NAMES, st.dictionaries(NAMES, NUMBERS, max_size=3), max_size=3),
              "backend": st.one_of(NAMES, st.none())})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.fixed_dictionaries({"listeners": st.lists(LISTENER, max_size=3)}))
def test_any_topology_document_loads_or_is_one_line(doc: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "topology.yaml"
        f.write_text(yaml.safe_dump(doc))
        try:
            assert isinstance(load_topology(f), TopologySpec)
        except ConfigError as e:
            assert str(e).startswith(f"topology file {f}: ") and "\n" not in str(e), str(e)
