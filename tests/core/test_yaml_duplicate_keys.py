"""A mapping key given twice in any YAML file a user hands opsloop is refused, naming the key's path and both
lines. PyYAML keeps the last silently: `capacity: 100` then `capacity: 10` in a topology, a second route in
an Alertmanager file, a second password in the credentials file, a second setting in the config file were
each a silent misconfiguration (only the simulator's scenarios had their own check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.collectors.iptables.ports import PortsError, parse_ports, read_ports_file
from opsloop.collectors.ipmi.config import InventoryError, load_inventory
from opsloop.collectors.keystone.credentials import CredentialsError, load as load_credentials
from opsloop.config import ConfigError, env_overrides, load_settings
from opsloop.config_cli import main as config_main
from opsloop.controllers.edge.service.config import load_topology
from opsloop.controllers.paging.amconfig import load_alertmanager_config
from opsloop.validation import YamlFileError, parse_yaml, read_yaml

TOPOLOGY = """listeners:
  - name: web
    edges: [{name: edge-ams}]
    origins:
      - name: near
        capacity_rps: 100
        capacity_rps: 10
    latency_ms: {edge-ams: {near: 2}}
"""


@pytest.mark.parametrize(("text", "expected"), [
    ("a: 1\nb: 2\na: 3\n", "a: given twice (lines 1 and 3); YAML keeps only the last"),
    ("x:\n  - {h: 1}\n  - {h: 1, h: 2}\n", "x.1.h: given twice (lines 3 and 3)"),
    ("n: 1\n01: x\n1: y\n", "1: given twice (lines 2 and 3)"),          # one key as YAML reads them
    ("yes: a\ntrue: b\n", "true: given twice (lines 1 and 2)"),
    ("m: &m {a: 1, a: 2}\nn: *m\n", "m.a: given twice (lines 1 and 1)"),  # named where it is written
    ("a: {b: 1}\nc: 1\nc: 2\nd: 1\nd: 2\n", "c: given twice (lines 2 and 3)"),   # the first of several
])
def test_a_key_given_twice_is_refused_naming_it_and_its_lines(text: str, expected: str) -> None:
    with pytest.raises(YamlFileError) as e:
        parse_yaml(text)
    assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_merge_keys_and_anchors_work_as_before() -> None:
    text = ("base: &b {capacity: 100, healthy: true}\n"
            "o1:\n  <<: *b\n  capacity: 10\n"                  # a merge is overridden by design
            "o2: {<<: [*b, {extra: 1}], name: x}\n"
            "l: &l [1, 2]\nd: [*l, *l]\n")
    assert parse_yaml(text) == {"base": {"capacity": 100, "healthy": True},
                                "o1": {"capacity": 10, "healthy": True},
                                "o2": {"capacity": 100, "healthy": True, "extra": 1, "name": "x"},
                                "l": [1, 2], "d": [[1, 2], [1, 2]]}
    assert parse_yaml("- a\n- a\n") == ["a", "a"] and parse_yaml("") is None


def test_every_reader_refuses_it(tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    with pytest.raises(ConfigError, match=r"topology file .*: listeners\.0\.origins\.0\.capacity_rps: given twice "
                                          r"\(lines 6 and 7\)"):
        load_topology(topo)
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text("collector:\n  interval_s: 15\n  timeout_s: 5\n  interval_s: 60\n")
    with pytest.raises(ConfigError, match=r"collector\.interval_s: given twice \(lines 2 and 4\)"):
        load_settings(cfg)
    am = tmp_path / "alertmanager.yml"
    am.write_text("route: {receiver: a}\nreceivers: [{name: a}]\nroute: {receiver: b}\n")
    with pytest.raises(ValueError, match=r"route: given twice \(lines 1 and 3\)"):
        load_alertmanager_config(am)
    inv = tmp_path / "bmcs.yaml"
    inv.write_text("hosts:\n  - {name: a, bmc: 10.0.0.1, bmc: 10.0.0.2}\n")
    with pytest.raises(InventoryError, match=r"hosts\.0\.bmc: given twice"):
        load_inventory(inv)
    ports = tmp_path / "ports.yaml"
    ports.write_text("- {port_id: 0695f2ca-bf4e, vm: web-1, vm: web-2}\n")
    with pytest.raises(PortsError, match=r"0\.vm: given twice"):
        read_ports_file(ports)
    with pytest.raises(PortsError, match=r"ports\.0\.vm: given twice"):
        parse_ports('{"ports": [{"port_id": "0695f2ca-bf4e", "vm": "a", "vm": "b"}]}', "ports command")


def test_the_credentials_file_names_no_key_or_value(tmp_path: Path) -> None:
    f = tmp_path / "creds.yaml"
    f.write_text("username: probe\npassword: first-s3cret\nproject: service\npassword: second-s3cret\n")
    with pytest.raises(CredentialsError) as e:
        load_credentials(f, "OPSLOOP_TEST_KS_", environ={})
    assert "a key given twice (lines 2 and 4)" in str(e.value), str(e.value)
    assert "s3cret" not in str(e.value) and "password" not in str(e.value)


def test_config_check_says_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text("kafka:\n  partitions: 8\n  client_id: a\n  partitions: 1\n")
    assert config_main(["check", str(cfg)]) == 2
    assert "kafka.partitions: given twice (lines 2 and 4); YAML keeps only the last" in capsys.readouterr().err


def test_an_environment_value_with_a_key_given_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^environment OPSLOOP__STACK__SCRAPE_TARGETS: a key given twice"):
        env_overrides({"OPSLOOP__STACK__SCRAPE_TARGETS": "{a: 1, a: 2}"})
    # not YAML at all: the string as given, as before
    assert env_overrides({"OPSLOOP__KAFKA__CLIENT_ID": "a: [b"}) == {"kafka": {"client_id": "a: [b"}}


def test_read_yaml_refuses_it_in_a_file(tmp_path: Path) -> None:
    f = tmp_path / "f.yaml"
    f.write_text("a: 1\na: 2\n")
    with pytest.raises(YamlFileError, match=r"^a: given twice \(lines 1 and 2\); YAML keeps only the last$"):
        read_yaml(f)
