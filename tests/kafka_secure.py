"""A real Kafka 3.9.1 broker with a SASL_SSL listener, for the security tests.

A CA and a broker certificate (SAN IP:127.0.0.1) are made with the real ``openssl``; SCRAM-SHA-512
users are created when the storage is formatted (``--add-scram``, KRaft), PLAIN users in the listener's
JAAS config. The broker keeps a PLAINTEXT listener for its own inter-broker traffic only; clients use the
SASL_SSL port. Started and stopped by PID like the session stack.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from opsloop.stack import ManagedProcess, free_port
from opsloop.stack.components import KAFKA_LIBS, _java, _kafka_cluster_id, _tcp_open

USERS = {"scram": ("opsloop-scram", "scram-secret-0123"), "plain": ("opsloop-plain", "plain-secret-4567")}


@dataclass
class SecureBroker:
    process: ManagedProcess
    port: int
    ca: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def make_ca_and_broker_cert(workdir: Path) -> tuple[Path, Path]:
    """(ca.pem, broker.pem holding the broker's key and certificate chain)."""
    workdir.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        r = subprocess.run(["openssl", *args], cwd=workdir, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {r.stderr}")

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=opsloop-test-ca",
            "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "broker.key",
            "-out", "broker.csr")
    (workdir / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.ext", "-out", "broker.crt")
    # Kafka's PEM keystore wants an unencrypted PKCS#8 key followed by the chain.
    openssl("pkcs8", "-topk8", "-nocrypt", "-in", "broker.key", "-out", "broker.p8")
    keystore = workdir / "broker.pem"
    keystore.write_text((workdir / "broker.p8").read_text() + (workdir / "broker.crt").read_text()
                        + (workdir / "ca.pem").read_text())
    return workdir / "ca.pem", keystore


def secure_broker(workdir: Path) -> SecureBroker:
    ca, keystore = make_ca_and_broker_cert(workdir / "tls")
    port, internal, controller = free_port(), free_port(), free_port()
    logs = workdir / "data"
    plain_user, plain_pw = USERS["plain"]
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        "listeners": f"SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config":
            f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{plain_user}="{plain_pw}";',
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "log.dirs": str(logs),
        "num.partitions": "2",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "2",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
    }
    workdir.mkdir(parents=True, exist_ok=True)
    server = workdir / "server.properties"
    server.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    (workdir / "log4j.properties").write_text(
        "log4j.rootLogger=WARN, stdout\nlog4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
        "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
        "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n")
    java, cp = _java(), f"{KAFKA_LIBS}/*"
    log4j = f"-Dlog4j.configuration=file:{workdir / 'log4j.properties'}"
    scram_user, scram_pw = USERS["scram"]
    r = subprocess.run([java, log4j, "-cp", cp, "kafka.tools.StorageTool", "format", "-t", _kafka_cluster_id(),
                        "-c", str(server), "--add-scram", f"SCRAM-SHA-512=[name={scram_user},password={scram_pw}]"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"kafka storage format failed: {r.stdout}{r.stderr}")
    argv = [java, "-Xms256m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true", log4j, "-cp", cp,
            "kafka.Kafka", str(server)]
    proc = ManagedProcess(name="kafka-sasl-ssl", argv=argv, workdir=workdir,
                          ports={"client": ("127.0.0.1", port), "internal": ("127.0.0.1", internal),
                                 "controller": ("127.0.0.1", controller)},
                          ready=lambda: _tcp_open("127.0.0.1", internal), ready_timeout_s=120)
    return SecureBroker(proc, port, ca)
