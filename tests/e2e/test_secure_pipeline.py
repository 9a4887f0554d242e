"""The pipeline end to end through a broker that only speaks SASL_SSL, with a CA made in the test.

The closed loop runs too, every service a process: collector -> stream worker -> edge control service ->
edge.weights -> weight actuator -> HAProxy weights.

haproxy collector (real HAProxy, real traffic) -> telemetry.lb -> Faust stream worker (lb-rates and
edge-demand agents, detector tables) -> edge.demand -> the edge controller's own demand consumer; every
client authenticates with SCRAM-SHA-512 over TLS from one ``kafka.security`` block, the password read
from a 0600 file. Every topic, consumer group and the Faust app id carry ``kafka.topic_prefix``, and a
second deployment with another prefix on the same broker sees none of it.

A wrong password or an untrusted CA ends the collector and the stream worker with exit status 2 and one
error line naming the problem (the preflight), never a worker waiting on a broker it cannot join; so does
the paging actuator (a kafka-python consumer and producer).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import requests
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from opsloop.controllers.edge.service.inputs import DemandBook, DemandConsumer
from opsloop.collect.publisher import Publisher
from opsloop.config import KafkaSettings
from opsloop.kafka_clients import client_options
from opsloop.lab.traffic import TrafficGenerator
from opsloop.kafka_admin import ensure_topics
from opsloop.stack import ManagedProcess, free_port
from opsloop.records import metric
from opsloop.topics import Topic
from tests.helpers import REPO, metrics_up, opsloop_process, unique, wait_until, write_config
from tests.kafka_secure import USERS, SecureBroker, make_ca_and_broker_cert

pytestmark = pytest.mark.integration

USER, PASSWORD = USERS["scram"]
RATE = 20.0   # requests/s through the edge
EXIT_TIMEOUT_S = 90   # bound on a failing service's exit (Python start-up included): a hang fails here


@pytest.fixture
def broker(secure_kafka: SecureBroker) -> SecureBroker:
    return secure_kafka   # the session's (conftest), shared with the other SASL_SSL modules


def secret_file(path: Path, secret: str) -> Path:
    """A password file created 0600 (never readable by others, not even for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return path


def kafka_section(broker: SecureBroker, tmp: Path, prefix: str, password: str = PASSWORD,
                  ca: Path | None = None) -> dict[str, Any]:
    return {"bootstrap_servers": broker.bootstrap, "partitions": 2, "topic_prefix": prefix,
            "security": {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "username": USER,
                         "password_file": str(secret_file(tmp / unique("kafka-password"), password)),
                         "ssl_cafile": str(ca or broker.ca)}}


def config_doc(tmp: Path, kafka: dict[str, Any], collectors: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "kafka": kafka,
        "stream": {"app_id": unique("opsloop-secure"), "data_dir": str(tmp / "streams"),
                   "metrics_port": free_port(), "web_port": free_port(), "batch_within_s": 0.2},
        "collector": {"interval_s": 1.0, "spool_dir": str(tmp / "spool"), "metrics_port": free_port(),
                      "send_timeout_s": 5.0},
        "collectors": collectors or {},
    }


def topics_and_groups(kafka: KafkaSettings) -> tuple[set[str], set[str]]:
    admin = KafkaAdminClient(**client_options(kafka), request_timeout_ms=20_000)
    try:
        return set(admin.list_topics()), {g["group_id"] if isinstance(g, dict) else g[0] for g in admin.list_groups()}
    finally:
        admin.close()


def read_all(kafka: KafkaSettings, topic: str, timeout_s: float = 30.0) -> list[Any]:
    """Every record in ``topic`` (name as on the cluster) up to its end when called, from the beginning."""
    consumer = KafkaConsumer(**client_options(kafka), group_id=None, enable_auto_commit=False)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)   # a topic still being written to: stop at today's end
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"reading {topic} to its end took over {timeout_s} s"
            for recs in consumer.poll(timeout_ms=500).values():
                out.extend(r for r in recs if r.offset < end[TopicPartition(r.topic, r.partition)])
        return out
    finally:
        consumer.close()


def test_collector_worker_and_controller_run_over_sasl_ssl_under_a_prefix(broker: SecureBroker, lab_edge,
                                                                         tmp_path: Path) -> None:
    prefix, other = f"{unique('a')}.", f"{unique('b')}."
    lab_edge.start()
    lb = unique("edge")
    kafka = kafka_section(broker, tmp_path, prefix)
    doc = config_doc(tmp_path, kafka, {"haproxy": {"instances": {lb: str(lab_edge.admin_socket)}}})
    config = write_config(tmp_path / "opsloop.yaml", doc)
    settings = KafkaSettings.model_validate(kafka)
    other_settings = settings.model_copy(update={"topic_prefix": other})

    wport, cport = doc["stream"]["metrics_port"], doc["collector"]["metrics_port"]
    worker = opsloop_process("stream-worker", ["stream", "worker", "--config", str(config)], tmp_path / "worker",
                             ready=lambda: metrics_up(wport))
    collector = opsloop_process("collector-haproxy", ["collect", "haproxy", "--config", str(config)],
                                tmp_path / "collector", ready=lambda: metrics_up(cport))
    # The controller side: the edge control service's demand consumer, under our prefix and the other one.
    ours, theirs = DemandBook(), DemandBook()
    consumers = [DemandConsumer(settings, ours), DemandConsumer(other_settings, theirs)]
    gen = None
    # The other deployment's topics exist (its controller listens on them) but it runs no worker.
    assert other_settings.topic(Topic.EDGE_DEMAND) in ensure_topics(other_settings, 2)
    worker.start()
    try:
        for c in consumers:
            c.start()
        # The worker created our prefixed topics; both consumers are positioned at their ends.
        for c in consumers:
            wait_until(c.assigned.is_set, timeout=90, what=f"the controller's {c.topic} consumer")
        collector.start()
        gen = TrafficGenerator(lab_edge.url, RATE, workers=4).start()
        demand = wait_until(lambda: next((r for (_, e), r in ours._latest.items() if e == lb and r.demand_rps > 0),
                                         None),
                            timeout=120, interval=0.5, what=f"edge.demand for {lb} at the controller")
        assert demand.edge == lb and demand.demand_rps > 0
        assert set(demand.origins) == {"near", "far"}

        # A malformed record on our telemetry topic reaches our dead-letter topic, with its reason.
        producer = KafkaProducer(**client_options(settings), acks="all")
        try:
            producer.send(settings.topic(Topic.LB), key=lb.encode(), value=b"{not json")
            producer.flush(timeout=30)
        finally:
            producer.close()

        def deadlettered() -> list[dict[str, Any]]:
            recs = [orjson.loads(r.value) for r in read_all(settings, settings.topic(Topic.DEADLETTER))]
            return [r for r in recs if r.get("source_topic") == settings.topic(Topic.LB) and r.get("key") == lb]
        dead = wait_until(deadlettered, timeout=60, interval=1, what="the malformed record in our dead-letter topic")
        assert dead[0]["value"] == "{not json" and dead[0]["reason"], dead

        # Names on the cluster: ours carry the prefix (topics, the worker's group = app id, its changelogs).
        topics, groups = topics_and_groups(settings)
        app_group = settings.group(doc["stream"]["app_id"])
        assert app_group in groups, groups
        for t in (Topic.LB, Topic.EDGE_DEMAND, Topic.DEADLETTER, Topic.FINDINGS, Topic.AUDIT):
            assert settings.topic(t) in topics, (t, sorted(topics))
            assert str(t) not in topics, f"unprefixed {t} exists: {sorted(topics)}"
        changelogs = [t for t in topics if t.endswith("-changelog")]
        assert changelogs and all(t.startswith(app_group) for t in changelogs), changelogs
        # The other deployment saw nothing: no demand reached its consumer, its topics hold no records.
        assert not theirs._latest and theirs.received == 0
        for t in (Topic.LB, Topic.EDGE_DEMAND):
            assert not read_all(other_settings, other_settings.topic(t))
    finally:
        if gen is not None:
            gen.stop()
        for c in consumers:
            c.stop()
        collector.stop()
        worker.stop()


def test_two_prefixes_on_one_broker_do_not_see_each_others_records(broker: SecureBroker, tmp_path: Path) -> None:
    base = KafkaSettings.model_validate(kafka_section(broker, tmp_path, ""))
    staging = base.model_copy(update={"topic_prefix": f"{unique('staging')}."})
    prod = base.model_copy(update={"topic_prefix": f"{unique('prod')}."})
    sent: dict[str, str] = {}
    for name, k in (("staging", staging), ("prod", prod)):
        pub = Publisher(k, tmp_path / f"spool-{name}", collector=name, send_timeout_s=20)
        try:
            m = metric("haproxy", {"hrsp_2xx": 1}, {"host": f"lb-{name}", "sv": "s1"})
            pub.publish_metrics([m])
            assert pub.flush(), f"{name}'s record was not acknowledged"
        finally:
            pub.close()
        sent[name] = f"lb-{name}"
    for name, k in (("staging", staging), ("prod", prod)):
        got = wait_until(lambda: read_all(k, k.topic(Topic.LB)), timeout=60, what=f"{name}'s telemetry.lb records")
        hosts = {s["tags"]["host"] for r in got for s in orjson.loads(r.value)["metrics"]}
        assert hosts == {sent[name]}, (name, hosts)


def run_until_exit(argv: list[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        return subprocess.run([sys.executable, "-m", "opsloop.cli", *argv], cwd=workdir, env=env, text=True,
                              capture_output=True, timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(argv[:2])} did not exit within {EXIT_TIMEOUT_S} s on bad Kafka credentials "
                    f"(a hang, not a clear error); stderr so far: {e.stderr!r}")


def error_lines(stderr: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict) and doc.get("level") in ("error", "ERROR", "critical", "CRITICAL"):
            out.append(doc)
    return out


@pytest.mark.parametrize("service", [["collect", "haproxy"], ["stream", "worker"], ["page", "run"]],
                         ids=["collector", "worker", "paging"])
@pytest.mark.parametrize("fault", ["wrong-password", "untrusted-ca"])
def test_bad_credentials_stop_a_service_at_once_with_one_clear_line(broker: SecureBroker, lab_edge, tmp_path: Path,
                                                                    service: list[str], fault: str) -> None:
    lab_edge.start()
    wrong = "definitely-not-the-password"
    ca = make_ca_and_broker_cert(tmp_path / "other-ca")[0] if fault == "untrusted-ca" else None
    kafka = kafka_section(broker, tmp_path, f"{unique('x')}.",
                          password=wrong if fault == "wrong-password" else PASSWORD, ca=ca)
    doc = config_doc(tmp_path, kafka, {"haproxy": {"instances": {"lb": str(lab_edge.admin_socket)}}})
    doc["controllers"] = {"paging": {"alertmanager_urls": ["http://127.0.0.1:9"], "metrics_port": free_port(),
                                     "state_file": str(tmp_path / "paging-state.json")}}
    config = write_config(tmp_path / "opsloop.yaml", doc)
    r = run_until_exit([*service, "--config", str(config)], tmp_path / "run")
    assert r.returncode == 78, (r.returncode, r.stderr[-2000:])   # EX_CONFIG: systemd does not restart it
    errors = error_lines(r.stderr)
    assert len(errors) == 1, r.stderr[-3000:]
    assert errors[0]["event"] == "kafka_preflight_failed", errors
    text = errors[0]["fields"]["error"]
    assert f"Kafka at {broker.bootstrap} as '{USER}' with SCRAM-SHA-512 over SASL_SSL" in text, text
    if fault == "wrong-password":
        assert "login" in text and "rejected" in text and "kafka.security.username, its password" in text, text
    else:
        assert "TLS handshake" in text and f"not trusted by ssl_cafile {ca}" in text, text
    assert wrong not in r.stderr and PASSWORD not in r.stderr and wrong not in r.stdout


def test_the_closed_loop_runs_over_sasl_ssl(broker: SecureBroker, lab_edge, tmp_path: Path) -> None:
    """Every service of the edge loop as a process, every one through the SASL_SSL listener under one prefix:
    collector -> stream worker -> edge control service -> edge.weights -> weight actuator -> HAProxy."""
    from opsloop.controllers.edge.service.api_token import create_token_file
    from opsloop.lb.haproxy import HaproxyAPI

    lab_edge.start(capacities={"near": 1000.0})
    lb, prefix = unique("edge"), f"{unique('loop')}."
    token = create_token_file(tmp_path / "edge.token")
    api_port, act_port = free_port(), free_port()
    kafka = kafka_section(broker, tmp_path, prefix)
    doc = config_doc(tmp_path, kafka, {"haproxy": {"instances": {lb: str(lab_edge.admin_socket)}}})
    doc["controllers"] = {
        "edge": {"interval_s": 1.0, "metrics_port": free_port(), "overrides_file": str(tmp_path / "overrides.json"),
                 "api": {"port": api_port, "token_file": str(tmp_path / "edge.token")},
                 "controller": {"stale_after_s": 10},
                 "topology": {"listeners": [{
                     "name": "web", "backend": "be_web", "edges": [{"name": lb}],
                     "origins": [{"name": "near", "capacity_rps": 1000}, {"name": "far", "capacity_rps": 1000}],
                     "latency_ms": {lb: {"near": 2, "far": 30}}}]}},
        "actuator": {"mode": "live", "stale_after_s": 30, "store_dir": str(tmp_path / "actuator-store"),
                     "targets": [{"edge": lb, "listener": "web", "kind": "haproxy",
                                  "socket": str(lab_edge.admin_socket), "backend": "be_web",
                                  "servers": {"near": "near", "far": "far"}}]}}
    config = write_config(tmp_path / "opsloop.yaml", doc)
    settings = KafkaSettings.model_validate(kafka)
    hap = HaproxyAPI(lab_edge.admin_socket)
    wport, cport = doc["stream"]["metrics_port"], doc["collector"]["metrics_port"]

    def status() -> dict[str, Any]:
        r = requests.get(f"http://127.0.0.1:{api_port}/v1/status", timeout=5,
                         headers={"Authorization": f"Bearer {token}"})
        r.raise_for_status()
        return r.json()["web"]

    procs = [
        opsloop_process("stream-worker", ["stream", "worker", "--config", str(config)], tmp_path / "worker",
                        ready=lambda: metrics_up(wport)),
        opsloop_process("collector-haproxy", ["collect", "haproxy", "--config", str(config)], tmp_path / "collector",
                        ready=lambda: metrics_up(cport)),
        ManagedProcess(name="edge-control", argv=[sys.executable, "-m", "opsloop.controllers.edge.service", "run", "--config",
                                                  str(config)], workdir=tmp_path / "edge-control",
                       env={"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
                       ready=lambda: requests.get(f"http://127.0.0.1:{api_port}/openapi.json", timeout=1).ok,
                       ready_timeout_s=90),
        opsloop_process("actuator", ["weights", "run", "--config", str(config), "--edge", lb, "--metrics-port",
                                     str(act_port)], tmp_path / "actuator", ready=lambda: metrics_up(act_port)),
    ]
    gen = None
    started: list[Any] = []
    try:
        for p in procs:
            p.start()
            started.append(p)
        gen = TrafficGenerator(lab_edge.url, RATE, workers=4).start()
        decided = wait_until(lambda: (s := status()).get("mode") == "normal" and s["demand_rps"].get(lb, 0) > 0 and s,
                             timeout=120, interval=0.5, what="the edge controller deciding on live demand")
        assert decided["version"] > 0, decided

        def applied() -> dict[str, Any] | None:
            s = status()
            near, far = hap.get_weight("be_web", "near")[0], hap.get_weight("be_web", "far")[0]
            want = (s.get("weights") or {}).get(lb, {}).get("near")
            return s if want is not None and near + far > 0 and abs(near / (near + far) - want) <= 0.01 else None
        wait_until(applied, timeout=90, interval=0.5, what="the controller's weights applied in HAProxy")
        # Every record of the loop went through prefixed topics; the actuator's group carries the prefix too.
        topics, groups = topics_and_groups(settings)
        assert read_all(settings, settings.topic(Topic.EDGE_WEIGHTS)), "no decision in the prefixed edge.weights"
        assert "edge.weights" not in topics and "telemetry.lb" not in topics, sorted(topics)
        assert any(g.startswith(f"{prefix}opsloop-actuator") for g in groups), groups
    finally:
        if gen is not None:
            gen.stop()
        for p in reversed(started):
            p.stop()
