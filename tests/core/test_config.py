"""The one config file: every section validated at load, one error per line with its path.

Each bad file below was accepted by `opsloop config check` (exit 0) before stage sections were
registered; the services rejected them only when they started.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from opsloop.config import (ConfigError, Settings, defaults_document, env_overrides, load_settings,
                            registered_sections)
from opsloop.config_cli import main as config_main

EDGE = {"topology_file": "topology.yaml"}


def write(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / "opsloop.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.parametrize("doc, line", [
    ({"controllers": {"edge": {**EDGE, "interval_s": "banana"}}},
     "controllers.edge.interval_s: Input should be a valid number"),
    ({"controllers": {"paging": {"resend_interval_s": -1}}},
     "controllers.paging.resend_interval_s: Input should be greater than 0 (got -1)"),
    ({"controllers": {"edge": {**EDGE, "interval_s": 0}}},
     "controllers.edge.interval_s: Input should be greater than 0 (got 0)"),
    ({"controllers": {"foo": {"x": 1}}},
     "controllers.foo: unknown section (known: actuator, edge, paging)"),
    ({"streams": {"detectors": {"anomaly": {"enabeld": True}}}},
     "streams.detectors.anomaly.enabeld: unknown setting"),
    ({"audit": {"max_buffered": 0}}, "audit.max_buffered: Input should be greater than or equal to 1 (got 0)"),
    ({"collectors": {"nosuch": {}}}, "collectors.nosuch: unknown collector 'nosuch'"),
    # dotted names used to import (and so run) a submodule, or validate against one
    ({"collectors": {"netperf.__main__": {}}}, "collectors.netperf.__main__: unknown collector 'netperf.__main__'"),
    ({"collectors": {"ipmi.config": {}}}, "collectors.ipmi.config: unknown collector 'ipmi.config'"),
    ({"collectors": {"IPMI": {}}}, "collectors.IPMI: unknown collector 'IPMI' (known: haproxy, ipmi, "),
])
def test_check_rejects_each_bad_file_with_its_path(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    doc: dict, line: str) -> None:
    assert config_main(["check", str(write(tmp_path, doc))]) == 2
    err = capsys.readouterr().err
    assert line in err, err


def test_collector_name_is_checked_before_anything_is_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # `collectors: {netperf.__main__: {}}` ran the netperf CLI (sys.exit) during `config check`.
    monkeypatch.delitem(sys.modules, "opsloop.collectors.netperf.__main__", raising=False)
    assert config_main(["check", str(write(tmp_path, {"collectors": {"netperf.__main__": {}}}))]) == 2
    assert "unknown collector 'netperf.__main__'" in capsys.readouterr().err
    assert "opsloop.collectors.netperf.__main__" not in sys.modules
    # the same name from the environment
    monkeypatch.setenv("OPSLOOP__COLLECTORS__IPMI.CONFIG__HOSTS", "[]")
    with pytest.raises(ConfigError, match=r"collectors\.ipmi\.config: unknown collector 'ipmi\.config'"):
        load_settings(None, discover=False)


def test_every_error_on_its_own_line_without_the_enclosing_dict(tmp_path: Path) -> None:
    doc = {"stream": {"batch_size": 0}, "controllers": {"foo": {}, "paging": {"resend_interval_s": -1},
                                                        "edge": {**EDGE, "interval_s": "banana"}}}
    with pytest.raises(ConfigError) as e:
        load_settings(write(tmp_path, doc))
    lines = str(e.value).splitlines()
    assert lines[0].endswith("4 errors:")
    assert sorted(x.strip().split(":")[0] for x in lines[1:]) == [
        "controllers.edge.interval_s", "controllers.foo", "controllers.paging.resend_interval_s", "stream.batch_size"]
    assert "topology_file" not in str(e.value)   # the offending value only, not the section around it


def test_old_section_names_still_work_with_a_deprecation_warning(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, {"controllers": {"detectors": {"anomaly": {"enabled": False}},
                                                       "audit": {"max_buffered": 9}}}))
    assert s.section("streams.detectors") == {"anomaly": {"enabled": False}}
    assert s.section("audit") == {"max_buffered": 9}
    assert "detectors" not in s.controllers and "audit" not in s.controllers
    assert any("controllers.detectors is deprecated" in w and "streams.detectors" in w for w in s.warnings)
    # settings built in code under the old name are found too
    assert Settings(controllers={"detectors": {"x": 1}}).section("streams.detectors") == {"x": 1}


def test_old_and_new_name_together_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="both controllers.detectors .* and streams.detectors"):
        load_settings(write(tmp_path, {"controllers": {"detectors": {}}, "streams": {"detectors": {}}}))


def test_environment_overrides_and_config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, {"controllers": {"paging": {"resend_interval_s": 30}}})
    monkeypatch.setenv("OPSLOOP_CONFIG", str(path))
    monkeypatch.setenv("OPSLOOP__CONTROLLERS__PAGING__RESEND_INTERVAL_S", "45")
    monkeypatch.setenv("OPSLOOP__KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:39092")
    s = load_settings()
    assert s.section("controllers.paging") == {"resend_interval_s": 45}
    assert s.kafka.bootstrap_servers == "127.0.0.1:39092"
    monkeypatch.setenv("OPSLOOP__CONTROLLERS__PAGING__RESEND_INTERVAL_S", "-5")
    with pytest.raises(ConfigError, match="controllers.paging.resend_interval_s"):
        load_settings()
    assert env_overrides({"OPSLOOP__A__B": "[1, 2]", "OTHER": "x", "OPSLOOP__": "y"}) == {"a": {"b": [1, 2]}}


def test_defaults_print_every_registered_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert config_main(["defaults"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc == defaults_document()
    for path in registered_sections():
        node = doc
        for part in path.split("."):
            node = node[part]
        assert isinstance(node, dict) and node, path
    assert doc["controllers"]["paging"]["resend_interval_s"] > 0
    assert doc["streams"]["detectors"]["anomaly"]["enabled"] in (True, False)
    assert doc["controllers"]["edge"]["topology_file"] is None   # required: no default to invent


def test_a_valid_file_passes_and_prints_the_effective_settings(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"controllers": {"edge": {**EDGE, "interval_s": 5}, "paging": {"resend_interval_s": 30}},
           "streams": {"detectors": {"anomaly": {"enabled": False}}}}
    assert config_main(["check", str(write(tmp_path, doc))]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["controllers"]["edge"]["interval_s"] == 5
    assert out["streams"]["detectors"]["anomaly"]["enabled"] is False
