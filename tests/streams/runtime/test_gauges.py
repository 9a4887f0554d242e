"""The handlers' child lookup must be ``labels()`` exactly, including after a child was removed."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge

from opsloop.streams.runtime.gauges import child


def _gauge() -> tuple[Gauge, CollectorRegistry]:
    reg = CollectorRegistry()
    return Gauge("t_gauge", "test", ["host", "kind"], registry=reg), reg


def test_child_is_the_labels_child_and_is_exported() -> None:
    g, reg = _gauge()
    first = child(g, "a", "x")        # created through labels()
    assert first is g.labels("a", "x")
    assert child(g, "a", "x") is first   # found in the metric's table (breaks if prometheus_client moves it)
    child(g, "a", "x").set(3.0)
    assert reg.get_sample_value("t_gauge", {"host": "a", "kind": "x"}) == 3.0


def test_a_removed_child_is_created_again() -> None:
    g, reg = _gauge()
    child(g, "a", "x").set(1.0)
    g.remove("a", "x")
    assert reg.get_sample_value("t_gauge", {"host": "a", "kind": "x"}) is None
    child(g, "a", "x").set(2.0)
    assert reg.get_sample_value("t_gauge", {"host": "a", "kind": "x"}) == 2.0
    g.clear()
    child(g, "a", "x").set(4.0)
    assert reg.get_sample_value("t_gauge", {"host": "a", "kind": "x"}) == 4.0


def test_values_that_are_not_strings_and_wrong_counts_behave_as_labels() -> None:
    g, reg = _gauge()
    child(g, "a", 7).set(1.0)   # type: ignore[arg-type]
    assert reg.get_sample_value("t_gauge", {"host": "a", "kind": "7"}) == 1.0
    assert child(g, "a", 7) is g.labels("a", "7")   # type: ignore[arg-type]
    with pytest.raises(ValueError, match="label count"):
        child(g, "a")
