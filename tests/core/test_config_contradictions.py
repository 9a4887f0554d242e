"""Settings each valid alone that cannot work together: one clear line naming both, exit 2.

Two local components on one port is not caught by any process: the second fails to bind and the
first answers its readiness probe (``stack up`` took Kafka's open port for Prometheus being up).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from opsloop.config_cli import main as config_main


def write(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / "opsloop.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.parametrize("doc, line", [
    ({"stack": {"prometheus_port": 29092}},
     "stack: kafka_port and prometheus_port are both 29092 (each component needs its own port)"),
    ({"stack": {"kafka_controller_port": 29400, "alertmanager_port": 29400}},
     "stack: kafka_controller_port and alertmanager_port are both 29400"),
    ({"stream": {"metrics_port": 29106}},
     "stream: metrics_port and web_port are both 29106"),
])
def test_two_things_on_one_port_are_refused_naming_both(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        doc: dict, line: str) -> None:
    assert config_main(["check", str(write(tmp_path, doc))]) == 2
    err = capsys.readouterr().err
    assert line in err, err
    assert len([x for x in err.splitlines() if "both" in x]) == 1, err


def test_a_contradiction_made_by_an_environment_override_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSLOOP__STACK__ALERTMANAGER_PORT", "29090")
    assert config_main(["check", str(write(tmp_path, {}))]) == 2
    assert "stack: prometheus_port and alertmanager_port are both 29090" in capsys.readouterr().err


def test_an_environment_override_of_the_wrong_type_is_one_line_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSLOOP__STACK__KAFKA_PORT", "ninety")
    assert config_main(["check", str(write(tmp_path, {}))]) == 2
    err = capsys.readouterr().err
    assert "stack.kafka_port: Input should be a valid integer" in err, err


def test_stream_metrics_disabled_does_not_clash_and_distinct_ports_pass(tmp_path: Path) -> None:
    doc = {"stream": {"metrics_port": 0}, "stack": {"kafka_port": 1, "kafka_controller_port": 2,
                                                    "prometheus_port": 3, "alertmanager_port": 4}}
    assert config_main(["check", str(write(tmp_path, doc))]) == 0
