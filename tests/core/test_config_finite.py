"""No setting of any section takes NaN or infinity. `collector.interval_s: .inf` passed `opsloop config
check`, and the collector then died each round with "the round failed: OverflowError"; the stages' and
collectors' own models set no `allow_inf_nan` either. Every float setting found in a full configuration
(the compose stack's file plus every collector's sample section, defaults included) is set to .inf, .nan
and "inf" in turn: each is one error line naming the key."""

from __future__ import annotations

import copy
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from opsloop.config import Settings, collector_config_model, registered_sections, validation_errors
from opsloop.config_cli import main as config_main
from opsloop.dotted import get_dotted
from tests.helpers import REPO, run_cli


def _full_document() -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "docker-compose" / "opsloop.yaml").read_text())
    for sample in sorted((REPO / "collectors").glob("*/sample.yaml")):
        doc["collectors"].update(yaml.safe_load(sample.read_text())["collectors"])
    return doc


FULL = _full_document()


def _is_float(annotation: Any) -> bool:
    if annotation is float:
        return True
    return isinstance(annotation, types.UnionType | typing._UnionGenericAlias) and float in typing.get_args(annotation)


def _float_paths(value: Any, where: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Every float setting (set or default, a float | None too) of a validated section, as a key path."""
    if isinstance(value, BaseModel):
        out = [(*where, n) for n, f in type(value).model_fields.items() if _is_float(f.annotation)]
        for name in type(value).model_fields:
            out += _float_paths(getattr(value, name), (*where, name))
        return out
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _float_paths(item, (*where, i))]
    if isinstance(value, dict):
        return [p for k, item in value.items() for p in _float_paths(item, (*where, k))]
    return []


def _all_float_paths() -> list[tuple[Any, ...]]:
    settings = Settings.model_validate({k: v for k, v in FULL.items() if k != "collectors"})
    paths = [p for p in _float_paths(settings, ()) if p[0] not in ("collectors", "streams", "controllers", "audit")]
    for name, section in FULL["collectors"].items():
        paths += _float_paths(collector_config_model(name).model_validate(section), ("collectors", name))
    for path, model in registered_sections().items():
        section = get_dotted(FULL, path)
        if section is not None:
            paths += _float_paths(model.model_validate(section), tuple(path.split(".")))
    return paths


PATHS = _all_float_paths()


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node: Any = doc
    for key in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(key, {})
        else:
            node = node[key]
    node[path[-1]] = value
    return doc


def test_the_full_document_is_valid_and_has_float_settings_of_every_kind() -> None:
    assert validation_errors(FULL) == []
    heads = {p[0] if p[0] not in ("collectors", "controllers", "streams") else ".".join(map(str, p[:2]))
             for p in PATHS}
    assert {"stack", "stream", "collector", "collectors.netperf", "collectors.ipmi", "controllers.edge",
            "controllers.paging", "controllers.actuator"} <= heads, heads
    assert len(PATHS) > 40


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), "inf"], ids=repr)
def test_no_float_setting_takes_a_non_finite_number(value: Any) -> None:
    accepted = []
    for path in PATHS:
        key = ".".join(map(str, path))
        errors = validation_errors(_set(FULL, path, value))
        if isinstance(value, float):   # YAML's .inf/.nan: the key's own line
            named = any(line.startswith(f"{key}:") for line in errors)
        else:   # a string is a float only once validated: a section's own check across fields may see it first
            head = ".".join(map(str, path[:2] if path[0] in ("collectors", "controllers", "streams") else path[:1]))
            named = any(line.startswith(head) and str(path[-1]) in line for line in errors)
        if not named:
            accepted.append((key, errors))
    assert accepted == []


def test_config_check_and_a_service_start_refuse_it_in_one_line(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text("collector: {interval_s: .inf}\ncollectors: {haproxy: {instances: [{url: 'http://127.0.0.1:1/'}]}}\n")
    assert config_main(["check", str(cfg)]) == 2
    assert "  collector.interval_s: Input should be a finite number (got inf)" in capsys.readouterr().err.splitlines()
    r = run_cli("collect", "haproxy", "--once", "--stdout", "--config", str(cfg), timeout=60)
    assert r.returncode == 78 and "Traceback" not in r.stderr, r.stderr[-2000:]   # EX_CONFIG: a service refusing it
    assert "collector.interval_s: Input should be a finite number (got inf)" in r.stderr
