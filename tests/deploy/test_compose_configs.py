"""docker-compose/: the compose file is valid for the real docker-compose 1.29 (no engine needed), every
file it mounts from the repository exists, and the configs it mounts are valid for their tools
(promtool for prometheus.yml, opsloop's loader for opsloop.yaml, YAML structure for Filebeat).

filebeat.yml is checked here for its structure; the real Filebeat runs it against real journal files
and a real Elasticsearch in test_logs_journald.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsloop.config import load_settings
from tests.helpers import REPO

COMPOSE_DIR = REPO / "docker-compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yml"
# Host paths a user's machine provides (journal, HAProxy socket dir): not repository files.
HOST_PATHS = ("/var/log/journal", "/run/log/journal", "/etc/machine-id", "/run/haproxy")


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _bind_mounts() -> list[tuple[str, str, str]]:
    """(service, source, target) of every bind mount (named volumes excluded)."""
    doc = _compose()
    out = []
    for name, svc in doc["services"].items():
        for vol in svc.get("volumes", []):
            src, target = vol.split(":")[:2]
            if src.startswith((".", "/")):
                out.append((name, src, target))
    return out


@pytest.mark.integration
def test_compose_file_is_valid_for_docker_compose() -> None:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose missing: make setup (Debian docker-compose)"
    r = subprocess.run([binary, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # The same check fails on a broken file (so a pass means something).
    broken = COMPOSE_DIR / ".broken-compose-test.yml"
    text = COMPOSE.read_text()
    assert "    image: prom/prometheus:" in text
    broken.write_text(text.replace("    image: prom/prometheus:", "    imagez: prom/prometheus:", 1))
    try:
        r = subprocess.run([binary, "-f", str(broken), "config", "-q"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "imagez" in r.stderr
    finally:
        broken.unlink()


def test_every_mounted_repository_file_exists() -> None:
    mounts = _bind_mounts()
    assert len(mounts) > 15
    for service, src, _ in mounts:
        if src.startswith("/"):
            assert src in HOST_PATHS, f"{service}: unexpected host path {src}"
            continue
        path = (COMPOSE_DIR / src).resolve()
        assert path.exists(), f"{service}: mounts {src} which does not exist ({path})"
        assert REPO in path.parents, f"{service}: {src} is outside the repository"


def test_compose_mounts_the_files_the_tests_use() -> None:
    sources = {(COMPOSE_DIR / s).resolve() for _, s, _ in _bind_mounts() if not s.startswith("/")}
    assert (REPO / "alerts" / "rules").resolve() in sources
    assert (REPO / "alerts" / "alertmanager.yml").resolve() in sources
    assert (REPO / "opsloop" / "audit" / "templates" / "logs.json").resolve() in sources
    for dash in (REPO / "dashboards").glob("*.json"):
        assert dash.resolve() in sources, f"{dash.name} is not provisioned into Grafana"
    services = set(_compose()["services"])
    assert {"kafka", "prometheus", "alertmanager", "grafana", "elasticsearch", "filebeat", "telegraf",
            "stream-worker"} <= services
    # The opsloop services share one image built from docker-compose/Dockerfile with the repo as context.
    built = {n: s["build"] for n, s in _compose()["services"].items() if "build" in s}
    assert built and all(b == {"context": "..", "dockerfile": "docker-compose/Dockerfile"} for b in built.values())
    assert len({_compose()["services"][n]["image"] for n in built}) == 1
    assert (COMPOSE_DIR / "Dockerfile").exists()


@pytest.mark.integration
def test_prometheus_config_is_valid_for_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: make setup (Debian prometheus)"
    cfg = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    assert cfg["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    # Inside the container the rules are alerts/rules, mounted: check them from the repository.
    cfg["rule_files"] = [str(REPO / "alerts" / "rules" / "*.yml")]
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([promtool, "check", "config", str(local)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


def test_opsloop_config_of_the_stack_loads() -> None:
    settings = load_settings(COMPOSE_DIR / "opsloop.yaml")
    assert settings.kafka.bootstrap_servers == "kafka:9092"
    from opsloop.audit.settings import AuditSettings

    audit = AuditSettings.from_settings(settings)
    assert audit.elasticsearch_url == "http://elasticsearch:9200" and audit.kafka
    scraped = {t for job in yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())["scrape_configs"]
               for sc in job["static_configs"] for t in sc["targets"]}
    assert f"stream-worker:{settings.stream.metrics_port}" in scraped
    assert f"collector-haproxy:{settings.collector.metrics_port}" in scraped


def test_filebeat_config_has_the_journald_input_and_our_template() -> None:
    doc = yaml.safe_load((COMPOSE_DIR / "filebeat.yml").read_text())
    inputs = doc["filebeat.inputs"]
    assert [i["type"] for i in inputs] == ["journald"]
    journald = inputs[0]
    # 7.17 takes a list (the 8.x `include_matches.match` is silently ignored by it): test_logs_journald.py
    assert journald["id"] and "SYSLOG_IDENTIFIER=opsloop" in journald["include_matches"]
    decode = [p["decode_json_fields"] for p in journald["processors"] if "decode_json_fields" in p]
    assert decode and decode[0]["fields"] == ["message"] and decode[0]["target"] == "opsloop"
    # The template Filebeat loads is the file the compose stack mounts, which test_logs_template.py loads
    # into a real Elasticsearch.
    mounted = {t: s for svc, s, t in _bind_mounts() if svc == "filebeat"}
    assert (COMPOSE_DIR / mounted[doc["setup.template.json.path"]]).resolve() == \
        (REPO / "opsloop" / "audit" / "templates" / "logs.json").resolve()
    assert doc["setup.template.pattern"] == "opsloop-logs-*"
    assert doc["output.elasticsearch"]["index"].startswith("opsloop-logs-")
    assert doc["setup.ilm.enabled"] is False      # the core-only Elasticsearch has no ILM
    assert doc.get("output.elasticsearch", {}).get("password") is None


def test_docker_logging_driver_feeds_the_journald_input() -> None:
    """The opsloop services log through Docker's journald driver with the tag Filebeat matches on."""
    doc = _compose()
    match = yaml.safe_load((COMPOSE_DIR / "filebeat.yml").read_text())["filebeat.inputs"][0]["include_matches"]
    tag = match[0].split("=", 1)[1]
    built = [s for s in doc["services"].values() if "build" in s]
    for svc in built:
        assert svc["logging"] == {"driver": "journald", "options": {"tag": tag}}


@pytest.mark.parametrize("path", ["dashboards/provisioning/datasources.yml", "dashboards/provisioning/dashboards.yml"])
def test_grafana_provisioning_files(path: str) -> None:
    doc = yaml.safe_load((REPO / path).read_text())
    assert doc["apiVersion"] == 1
    if "datasources" in doc:
        uids = {d["uid"]: d for d in doc["datasources"]}
        assert uids["prometheus"]["type"] == "prometheus" and uids["prometheus"]["isDefault"]
        assert uids["opsloop-audit"]["jsonData"]["index"] == "opsloop-audit*"
    else:
        target = doc["providers"][0]["options"]["path"]
        grafana = _compose()["services"]["grafana"]["volumes"]
        assert sum(1 for v in grafana if v.split(":")[1].startswith(target + "/")) == \
            len(list((REPO / "dashboards").glob("*.json")))
