"""The real components of the local stack: Kafka (KRaft, single node), Prometheus, Alertmanager.

Each builder writes the component's configuration under its data directory and returns a
:class:`ManagedProcess` with a readiness check. Ports bind to loopback only.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import requests
import yaml

from opsloop.config import REPO_ROOT
from opsloop.paths import shipped, write_private
from opsloop.stack.process import ManagedProcess, StackError, require_binary

KAFKA_LIBS = REPO_ROOT / ".cache" / "kafka" / "libs"
ALERTS_DIR = shipped("alerts")


def _tcp_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _http_ok(url: str) -> bool:
    return requests.get(url, timeout=1).status_code == 200


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    return require_binary("java", "install a Java 17 runtime (make setup)")


def kafka(data_dir: Path, host: str, port: int, controller_port: int, heap: str = "512m",
          partitions: int = 4) -> ManagedProcess:
    if not (KAFKA_LIBS / "kafka_2.13-3.9.1.jar").exists():
        raise StackError(f"kafka: broker jars missing in {KAFKA_LIBS}; run `make setup`")
    work = data_dir / "kafka"
    logs = work / "data"
    work.mkdir(parents=True, exist_ok=True)
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(logs),
        "num.partitions": str(partitions),
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "log.retention.hours": "24",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }
    (work / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    (work / "log4j.properties").write_text(
        "log4j.rootLogger=WARN, stdout\n"
        "log4j.logger.kafka.server.KafkaServer=INFO\nlog4j.logger.kafka.server.KafkaRaftServer=INFO\n"
        "log4j.logger.kafka.Kafka$=INFO\n"
        "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
        "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
        "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n")
    java = _java()
    cp = f"{KAFKA_LIBS}/*"
    log4j = f"-Dlog4j.configuration=file:{work / 'log4j.properties'}"
    if not (logs / "meta.properties").exists():
        import subprocess

        cluster_id = _kafka_cluster_id()
        r = subprocess.run([java, log4j, "-cp", cp, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                            "-c", str(work / "server.properties")], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise StackError(f"kafka: storage format failed: {r.stdout}{r.stderr}")
    argv = [java, f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true", log4j, "-cp", cp, "kafka.Kafka", str(work / "server.properties")]
    return ManagedProcess(name="kafka", argv=argv, workdir=work,
                          ports={"client": (host, port), "controller": (host, controller_port)},
                          ready=lambda: _tcp_open(host, port) and _kafka_ready(f"{host}:{port}"),
                          ready_timeout_s=90)


def _kafka_cluster_id() -> str:
    # KRaft cluster ids are 16 random bytes, url-safe base64 without padding (22 chars). Like Kafka's
    # Uuid.randomUuid, never one starting with "-": the storage tool would read it as an option
    # (1 start in 64 failed with "argument --cluster-id/-t: expected one argument").
    import base64

    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _kafka_ready(bootstrap: str) -> bool:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000, bootstrap_timeout_ms=3000)
    try:
        admin.list_topics()
        return True
    finally:
        admin.close()


def prometheus(data_dir: Path, host: str, port: int, scrape_targets: list[str], scrape_interval_s: float,
               alertmanager: str | None, rule_files: list[Path] | None = None) -> ManagedProcess:
    binary = require_binary("prometheus", "install Debian's prometheus package (make setup)")
    work = data_dir / "prometheus"
    work.mkdir(parents=True, exist_ok=True)
    if rule_files is None:
        rule_files = sorted(p for p in ALERTS_DIR.glob("rules/*.yml")) if ALERTS_DIR.exists() else []
    cfg: dict = {
        "global": {"scrape_interval": f"{int(scrape_interval_s * 1000)}ms",
                   "evaluation_interval": f"{int(scrape_interval_s * 1000)}ms"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": "opsloop", "static_configs": [{"targets": scrape_targets}],
             # Targets added at run time (tests, `opsloop run`): one JSON file per target group.
             "file_sd_configs": [{"files": [str(work / "targets" / "*.json")], "refresh_interval": "5s"}]},
            {"job_name": "prometheus", "static_configs": [{"targets": [f"{host}:{port}"]}]},
        ],
    }
    if alertmanager:
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    (work / "targets").mkdir(exist_ok=True)
    (work / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    argv = [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
            # No --web.enable-lifecycle: it opens unauthenticated POST /-/quit and /-/reload, and nothing uses them.
            f"--web.listen-address={host}:{port}", "--log.format=json",
            "--storage.tsdb.retention.time=2d"]
    return ManagedProcess(name="prometheus", argv=argv, workdir=work, ports={"web": (host, port)},
                          ready=lambda: _http_ok(f"http://{host}:{port}/-/ready"))


def alertmanager(data_dir: Path, host: str, port: int, config: Path | None = None) -> ManagedProcess:
    binary = require_binary("prometheus-alertmanager", "install Debian's prometheus-alertmanager (make setup)")
    work = data_dir / "alertmanager"
    work.mkdir(parents=True, exist_ok=True)
    cfg_path = work / "alertmanager.yml"
    if config is not None:
        write_private(cfg_path, config.read_text())   # receiver URLs are secrets: 0600 from creation
    elif not cfg_path.exists():
        cfg_path.write_text(yaml.safe_dump({
            "route": {"receiver": "null", "group_wait": "1s", "group_interval": "5s", "repeat_interval": "1h"},
            "receivers": [{"name": "null"}],
        }))
    argv = [binary, f"--config.file={cfg_path}", f"--storage.path={work / 'data'}",
            f"--web.listen-address={host}:{port}", "--cluster.listen-address=", "--log.format=json"]
    return ManagedProcess(name="alertmanager", argv=argv, workdir=work, ports={"web": (host, port)},
                          ready=lambda: _http_ok(f"http://{host}:{port}/-/ready"))
