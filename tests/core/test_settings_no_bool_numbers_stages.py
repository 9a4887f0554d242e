"""A boolean where a number is meant is refused in every stage's settings, with its path, as in the core's.

YAML reads an unquoted yes/no/on/off as a boolean and pydantic took it as 1 or 0: `opsloop config check`
passed `streams.detectors.netperf.baseline_runs: yes` (one run), `collectors.lvs.timeout_s: yes` (1 s),
`audit.max_buffered: yes` (one record), `controllers.edge.api.port: on` (port 1), a topology latency `yes`
(1 ms: the nearest origin). A bad edge controller setting was named at `controllers.edge.max_step`, a setting
that does not exist, instead of `controllers.edge.controller.max_step`.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Iterator

import pytest
import requests

from opsloop.audit.trail import AuditLog
from opsloop.config_cli import main as config_main
from opsloop.controllers.edge.service.api import EdgeApi
from opsloop.controllers.edge.service.config import TopologySpec
from opsloop.controllers.edge.service.store import TopologyStore

BOOL = "expected a number, not a boolean"
TOPOLOGY = ("    topology:\n      listeners:\n        - name: web\n          edges: [{name: ams}]\n"
            "          origins: [{name: near, capacity_rps: 40}, {name: far, capacity_rps: 1000}]\n")
NETPERF = "collectors:\n  netperf:\n    target_sets:\n      - name: s\n        targets: [10.0.0.1]\n"


def check(text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text(text)
    code = config_main(["check", str(cfg)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("text", "where"), [
    ("streams:\n  detectors:\n    refresh_s: yes\n", "streams.detectors.refresh_s"),
    ("streams:\n  detectors:\n    netperf: {baseline_runs: yes}\n", "streams.detectors.netperf.baseline_runs"),
    ("streams:\n  detectors:\n    keystone: {p95_min_requests: on}\n", "streams.detectors.keystone.p95_min_requests"),
    ("streams:\n  detectors:\n    power: {eur_per_kwh: on}\n", "streams.detectors.power.eur_per_kwh"),
    ("streams:\n  detectors:\n    power: {hosts: {st1: {raw_tb: yes}}}\n", "streams.detectors.power.hosts.st1.raw_tb"),
    ("streams:\n  detectors:\n    firewall: {min_role_size: yes}\n", "streams.detectors.firewall.min_role_size"),
    ("streams:\n  detectors:\n    anomaly: {clear_after: yes}\n", "streams.detectors.anomaly.clear_after"),
    ("streams:\n  detectors:\n    anomaly: {detector: {warmup_points: yes}}\n",
     "streams.detectors.anomaly.detector.warmup_points"),
    ("collectors:\n  keystone: {probes: {samples: yes}}\n", "collectors.keystone.probes.samples"),
    ("collectors:\n  keystone: {frontend: {top_credentials: on}}\n", "collectors.keystone.frontend.top_credentials"),
    ("collectors:\n  keystone: {round_timeout_s: yes}\n", "collectors.keystone.round_timeout_s"),
    (NETPERF + "        repetitions: yes\n", "collectors.netperf.target_sets.0.repetitions"),
    (NETPERF + "    max_round_s: on\n", "collectors.netperf.max_round_s"),
    ("collectors:\n  lvs: {timeout_s: yes}\n", "collectors.lvs.timeout_s"),
    ("collectors:\n  iptables: {max_concurrency: on, ports_file: /dev/null}\n", "collectors.iptables.max_concurrency"),
    ("collectors:\n  haproxy: {instances: {lb1: /run/haproxy.sock}, timeout_s: yes}\n", "collectors.haproxy.timeout_s"),
    ("audit:\n  max_buffered: yes\n", "audit.max_buffered"),
    ("audit:\n  elasticsearch: {hosts: ['http://127.0.0.1:9200'], request_timeout_s: yes}\n",
     "audit.elasticsearch.request_timeout_s"),
    ("controllers:\n  edge:\n    interval_s: yes\n" + TOPOLOGY, "controllers.edge.interval_s"),
    ("controllers:\n  edge:\n    api: {port: on}\n" + TOPOLOGY, "controllers.edge.api.port"),
    ("controllers:\n  edge:\n" + TOPOLOGY + "          latency_ms: {ams: {near: yes, far: 30}}\n",
     "controllers.edge.topology.listeners.0.latency_ms.ams.near"),
])
def test_config_check_refuses_a_boolean_for_a_number(text: str, where: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, err = check(text, tmp_path, capsys)
    assert code == 2, err
    assert f"{where}: {BOOL}" in err, err


@pytest.mark.parametrize(("block", "line"), [
    ("    controller: {max_step: true}\n", f"controllers.edge.controller.max_step: {BOOL}"),
    ("    controller: {max_step: 2}\n", "controllers.edge.controller.max_step: Input should be less than or equal"),
    ("    controller: {relax_step: 0.9}\n", "controllers.edge.controller: relax_step: must not exceed max_step"),
])
def test_a_bad_edge_controller_setting_is_named_at_its_path(block: str, line: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, err = check("controllers:\n  edge:\n" + block + TOPOLOGY, tmp_path, capsys)
    assert code == 2 and line in err, err   # before: controllers.edge.max_step (no such setting)


def test_numbers_and_real_booleans_still_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = ("streams:\n  detectors:\n    refresh_s: 60\n    netperf: {baseline_runs: 3, enabled: no}\n"
            "    power: {hosts: {st1: {raw_tb: 96, in_service: yes}}}\n"
            "    anomaly: {detector: {warmup_points: 40, z_width: 2}}\n"
            "collectors:\n  keystone: {probes: {samples: 3, enabled: yes}}\n  lvs: {timeout_s: 2}\n"
            "audit:\n  max_buffered: 100\n  kafka: true\n"
            "controllers:\n  edge:\n    interval_s: 10\n    recover: no\n"
            "    controller: {max_step: 1, anticipate_ramp: off}\n"
            + TOPOLOGY + "          latency_ms: {ams: {near: 2, far: 30.5}}\n")
    code, err = check(text, tmp_path, capsys)
    assert code == 0, err


@pytest.fixture
def edge_api() -> Iterator[tuple[str, str]]:
    topo = TopologySpec.model_validate({"listeners": [{
        "name": "web", "edges": [{"name": "ams"}], "origins": [{"name": "near", "capacity_rps": 40}],
        "latency_ms": {"ams": {"near": 2}}}]})

    class Discard:
        def submit(self, record: object) -> None:
            pass

    token = secrets.token_hex(20)
    api = EdgeApi(TopologyStore(topo, AuditLog([Discard()])), token, lambda: {}, lambda listener: [])
    api.serve("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{api.port}", token
    finally:
        api.stop()


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/listeners/web/origins/near/capacity", {"capacity_rps": True}, "capacity_rps"),
    ("/v1/listeners/web/edges/ams/latency/near", {"latency_ms": False}, "latency_ms"),
])
def test_the_edge_api_refuses_a_boolean_override(edge_api: tuple[str, str], path: str, body: dict, field: str) -> None:
    base, token = edge_api
    r = requests.put(base + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=5)
    assert r.status_code == 400 and r.json()["error"].startswith(f"{field}: expected a number"), r.text
    origin = requests.get(base + "/v1/listeners/web/origins/near", headers={"Authorization": f"Bearer {token}"},
                          timeout=5).json()
    assert origin["capacity_rps"] == 40   # unchanged
