"""The topology file and the controllers.edge section: validated, errors name field and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.controllers.edge.service.app import main
from opsloop.controllers.edge.service.api_token import create_token_file
from opsloop.controllers.edge.service.config import (ConfigError, EdgeServiceSettings, load_topology, read_token,
                                             ApiSettings)
from tests.helpers import REPO

EXAMPLE = REPO / "controllers" / "edge" / "topology.yaml"


def test_shipped_example_is_valid() -> None:
    topo = load_topology(EXAMPLE)
    web = topo.listener("web")
    assert web.backend_name == "be_web" and [o.name for o in web.origins] == ["near", "far"]
    assert main(["check", "--topology", str(EXAMPLE)]) == 0


@pytest.mark.parametrize("text,needle", [
    ("listeners: []", "listeners"),
    ("listeners:\n - {name: w, edges: [{name: e}], origins: [{name: o, capacity_rps: -5}]}", "-5"),
    ("listeners:\n - {name: w, edges: [{name: e}], origins: [{name: o, capacity_rps: 1}],"
     " latency_ms: {e: {mars: 3}}}", "'mars'"),
    ("listeners:\n - {name: w, edges: [{name: e}], origins: [{name: o, capacity_rps: 1}],"
     " latency_ms: {x: {o: 3}}}", "'x'"),
    ("listeners:\n - {name: w, edges: [{name: e}, {name: f, lb: e}], origins: [{name: o, capacity_rps: 1}]}",
     "'e'"),
    ("listeners:\n - {name: w, edges: [{name: e}], origins: [{name: o, capacity_rps: 1}], colour: red}", "colour"),
    ("listeners: [\n", "not valid YAML"),
])
def test_bad_topology_names_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "t.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="topology file") as e:
        load_topology(p)
    assert needle in str(e.value)
    assert main(["check", "--topology", str(p)]) == 2


def test_section_needs_exactly_one_topology_and_valid_controller_settings() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        EdgeServiceSettings.model_validate({})
    with pytest.raises(ValueError, match="relax_step"):
        EdgeServiceSettings.model_validate({"topology_file": "x.yaml", "controller": {"relax_step": 0.9,
                                                                                      "max_step": 0.5}})
    assert EdgeServiceSettings.model_validate({"topology_file": "x", "interval_s": 2}).controller_settings().interval_s == 2


def test_token_from_file_or_env_and_too_short_refused(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "tok"
    create_token_file(f, "s3cret-s3cret-s3cret")
    assert read_token(ApiSettings(token_file=f)) == "s3cret-s3cret-s3cret"
    monkeypatch.setenv("OPSLOOP_EDGE_API_TOKEN", "short")
    with pytest.raises(ConfigError, match="shorter than 16") as e:
        read_token(ApiSettings())
    assert "short" not in str(e.value).replace("shorter", "")   # the token itself is never echoed
    with pytest.raises(ConfigError, match="token_file"):
        read_token(ApiSettings(token_file=tmp_path / "missing"))


def test_demand_staleness_not_above_the_collection_interval_is_refused_naming_both_keys() -> None:
    from opsloop.config import validation_errors

    edge = {"topology_file": str(EXAMPLE), "interval_s": 5, "controller": {"stale_after_s": 10}}
    # demand measured every 10 s (+ up to 2 s of jitter): at 10 s it is stale before the next measurement
    errors = validation_errors({"collector": {"interval_s": 10, "jitter_s": 2}, "controllers": {"edge": edge}})
    assert errors == ["controllers.edge.controller.stale_after_s (10) must be above collector.interval_s (10) + "
                      "collector.jitter_s (2): demand is measured once per collection, so every measurement would be "
                      "stale before the next and the controller would hold between them"]
    # the collector's default interval (15 s) counts when the file sets none
    assert "collector.interval_s (15)" in validation_errors({"controllers": {"edge": edge}})[0]
    assert validation_errors({"collector": {"interval_s": 5, "jitter_s": 2}, "controllers": {"edge": edge}}) == []
