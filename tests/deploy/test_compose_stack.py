"""docker-compose/: every opsloop service is in the stack, every service has a healthcheck, and start-up
order waits for health. No Docker engine runs here: the file is validated by the real docker-compose 1.29
(`config -q`), and the opsloop services' healthcheck command is run for real against a local /metrics.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsloop.config import load_settings
from opsloop.metrics import serve_metrics
from opsloop.stack import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "docker-compose"
# opsloop subcommand -> the config section whose metrics port its healthcheck probes
OPSLOOP_SERVICES = {("stream", "worker"): "stream", ("collect", "haproxy"): "collector", ("collect", "ipmi"): "collector",
                    ("page", "run"): "controllers.paging", ("edge", "run"): "controllers.edge",
                    ("weights", "run"): "controllers.actuator"}


def compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())


def opsloop_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose()["services"].items() if "build" in s}


@pytest.mark.integration
def test_no_obsolete_version_key_and_the_file_validates() -> None:
    assert "version" not in compose()
    r = subprocess.run(["docker-compose", "-f", str(COMPOSE_DIR / "docker-compose.yml"), "config", "-q"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        assert svc.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on without conditions"
        for dep, cond in deps.items():
            assert cond == {"condition": "service_healthy"}, (name, dep, cond)
            assert "healthcheck" in services[dep]


def test_every_opsloop_service_runs_with_the_ports_its_config_and_prometheus_use() -> None:
    settings = load_settings(COMPOSE_DIR / "opsloop.yaml", discover=False)
    scraped = {t for job in yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())["scrape_configs"]
               for sc in job["static_configs"] for t in sc["targets"]}
    seen = set()
    for name, svc in opsloop_services().items():
        cmd = tuple(svc["command"][:2])
        assert cmd in OPSLOOP_SERVICES, f"{name}: unexpected command {svc['command']}"
        seen.add(cmd)
        section = OPSLOOP_SERVICES[cmd]
        port = (getattr(settings, section).metrics_port if "." not in section
                else settings.section(section)["metrics_port"])
        assert svc["environment"]["METRICS_PORT"] == str(port), name
        assert f"{name}:{port}" in scraped, f"Prometheus does not scrape {name}:{port}"
        assert svc["environment"]["OPSLOOP_CONFIG"] == "/etc/opsloop/opsloop.yaml"
    assert seen == set(OPSLOOP_SERVICES), set(OPSLOOP_SERVICES) - seen


def test_the_weight_actuator_starts_in_shadow_mode_with_a_target_for_its_edge() -> None:
    settings = load_settings(COMPOSE_DIR / "opsloop.yaml", discover=False)
    actuator = settings.section("controllers.actuator")
    assert actuator["mode"] == "shadow"
    edge = opsloop_services()["weight-actuator"]["command"][-1]
    assert any(t["edge"] == edge for t in actuator["targets"])


def test_the_edge_topology_of_the_stack_validates() -> None:
    r = subprocess.run([sys.executable, "-m", "opsloop.cli", "edge", "check", "--config", str(COMPOSE_DIR / "opsloop.yaml"),
                        "--topology", str(COMPOSE_DIR / "edge-topology.yaml"),
                        "--skip-token"],   # the token is a secret file of the container, not on this host
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def _healthcheck_argv() -> list[str]:
    test = compose()["x-opsloop"]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "python"
    return [sys.executable, *test[2:]]


def test_the_opsloop_healthcheck_passes_on_a_live_metrics_endpoint_and_fails_without_one() -> None:
    port = free_port()
    server = serve_metrics(port, "127.0.0.1")
    try:
        ok = subprocess.run(_healthcheck_argv(), env={"METRICS_PORT": str(port)}, capture_output=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
    finally:
        server.shutdown()
        server.server_close()
    down = subprocess.run(_healthcheck_argv(), env={"METRICS_PORT": str(free_port())}, capture_output=True, timeout=30)
    assert down.returncode != 0
