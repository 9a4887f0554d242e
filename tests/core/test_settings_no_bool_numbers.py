"""A boolean where a number is meant is refused with its path. Pydantic reads `true` as 1: `max_step: true`
in the edge controller's settings was a step of 100 %, `kafka.partitions: yes` one partition, an IPMI
`cipher_suite: on` suite 1 — each passed `opsloop config check`."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from opsloop.collectors.ipmi.config import Config as IpmiConfig
from opsloop.config_cli import main as config_main
from opsloop.controllers.edge.settings import ControllerSettings, FixedStepSettings
from opsloop.validation import error_lines

BOOL = "expected a number, not a boolean"


@pytest.mark.parametrize(("model", "doc", "where"), [
    (ControllerSettings, {"max_step": True}, "max_step"),
    (ControllerSettings, {"demand_window": False}, "demand_window"),
    (FixedStepSettings, {"step": True}, "step"),
    (IpmiConfig, {"hosts": [{"name": "a", "bmc": "b", "port": True}]}, "hosts.0.port"),
    (IpmiConfig, {"hosts": [{"name": "a", "bmc": "b", "metadata": {"disks": True}}]}, "hosts.0.metadata.disks"),
])
def test_a_boolean_for_a_number_is_refused(model: type, doc: dict, where: str) -> None:
    with pytest.raises(ValidationError) as e:
        model.model_validate(doc)
    assert any(line.startswith(f"{where}: {BOOL}") for line in error_lines(e.value)), error_lines(e.value)


def test_numbers_and_real_booleans_still_validate() -> None:
    s = ControllerSettings.model_validate({"max_step": 1, "demand_window": 3, "anticipate_ramp": False})
    assert s.max_step == 1.0 and s.demand_window == 3 and s.anticipate_ramp is False
    assert IpmiConfig.model_validate({"hosts": [{"name": "a", "bmc": "b", "port": 623}], "retries": "2"}).retries == 2


@pytest.mark.parametrize(("text", "line"), [
    ("kafka:\n  partitions: yes\n", f"kafka.partitions: {BOOL}"),
    ("collector:\n  interval_s: on\n", f"collector.interval_s: {BOOL}"),
    ("controllers:\n  edge:\n    topology_file: /dev/null\n    controller: {max_step: true}\n", BOOL),
])
def test_config_check_refuses_it(text: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text(text)
    assert config_main(["check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert line in err and ("max_step" in err or "max_step" not in text), err
