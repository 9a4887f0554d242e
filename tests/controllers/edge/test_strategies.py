"""Hypothesis strategies shared by the edge-controller tests (no tests here): random assignment problems."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st


@st.composite
def problems(draw, max_edges: int = 6, max_origins: int = 5, allow_unreachable: bool = True,
             allow_unhealthy: bool = True):
    """(demand[E], capacity[O], latency[E,O], healthy[O], previous[E,O])."""
    n_edges = draw(st.integers(1, max_edges))
    n_origins = draw(st.integers(1, max_origins))
    rps = st.floats(0.0, 1000.0, allow_nan=False)
    demand = np.array(draw(st.lists(rps, min_size=n_edges, max_size=n_edges)))
    capacity = np.array(draw(st.lists(rps, min_size=n_origins, max_size=n_origins)))
    ms = st.floats(0.0, 300.0, allow_nan=False)
    if allow_unreachable:
        ms = st.one_of(ms, ms, ms, st.just(math.inf))
    latency = np.array([draw(st.lists(ms, min_size=n_origins, max_size=n_origins))
                        for _ in range(n_edges)])
    healthy = np.array(draw(st.lists(st.booleans() if allow_unhealthy else st.just(True),
                                     min_size=n_origins, max_size=n_origins)))
    raw = np.array([draw(st.lists(st.floats(0.0, 1.0), min_size=n_origins, max_size=n_origins))
                    for _ in range(n_edges)])
    raw[raw.sum(axis=1) == 0, 0] = 1.0
    previous = raw / raw.sum(axis=1, keepdims=True)
    return demand, capacity, latency, healthy, previous
