"""Kafka TLS + SASL against a real broker with a SASL_SSL listener and a CA made in the test.

SCRAM-SHA-512 and PLAIN users round-trip records through kafka-python's producer, consumer and admin
client built from the one ``kafka.security`` block; a wrong password fails fast with an error that
says authentication failed (not a hang, not a generic time-out); an untrusted CA fails the TLS handshake.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from opsloop.config import KafkaSettings
from opsloop.kafka_clients import preflight_or_exit
from opsloop.kafka_security import (KafkaSecurity, KafkaSecurityError, KafkaUnreachable, kafka_python_options,
                                    preflight, read_secret_file)
from opsloop.stack import free_port
from tests.kafka_secure import USERS, SecureBroker, make_ca_and_broker_cert

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(secure_kafka: SecureBroker) -> SecureBroker:
    return secure_kafka   # the session's (conftest), shared with the other SASL_SSL modules


def security(broker: SecureBroker, kind: str, password: str | None = None) -> KafkaSecurity:
    user, pw = USERS[kind]
    return KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512" if kind == "scram" else "PLAIN",
                         username=user, password=password or pw, ssl_cafile=broker.ca)


@pytest.mark.parametrize("kind", ["scram", "plain"])
def test_records_round_trip_over_sasl_ssl(broker: SecureBroker, kind: str) -> None:
    opts = kafka_python_options(security(broker, kind))
    topic = f"secure-{kind}-{os.getpid()}"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, **opts)
    try:
        from kafka.admin import NewTopic

        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", **opts)
    for i in range(5):
        producer.send(topic, key=b"k", value=f"r{i}".encode())
    producer.flush(timeout=60)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=None, auto_offset_reset="earliest",
                             consumer_timeout_ms=20_000, **opts)
    try:
        got = [m.value for m in consumer]
    finally:
        consumer.close()
    assert got == [f"r{i}".encode() for i in range(5)]


@pytest.mark.parametrize("kind", ["scram", "plain"])
def test_a_wrong_password_fails_within_the_preflight_limit_and_says_so(broker: SecureBroker, kind: str) -> None:
    """kafka-python alone retries a rejected login until its bootstrap time-out and says only "Unable to
    bootstrap"; the preflight every service runs names the user, the mechanism and the cause."""
    sec = security(broker, kind, password="not-the-password")
    with pytest.raises(KafkaSecurityError) as e:
        preflight(broker.bootstrap, sec, timeout_s=8)
    msg = str(e.value)
    assert f"as {USERS[kind][0]!r} with {sec.sasl_mechanism} over SASL_SSL" in msg, msg
    assert "rejected the login or dropped it during SASL authentication" in msg
    assert "not-the-password" not in msg
    preflight(broker.bootstrap, security(broker, kind), timeout_s=30)   # the right one passes


def test_an_untrusted_ca_fails_the_handshake(broker: SecureBroker, tmp_path: Path) -> None:
    other_ca, _ = make_ca_and_broker_cert(tmp_path / "other")
    sec = security(broker, "scram").model_copy(update={"ssl_cafile": other_ca})
    with pytest.raises(KafkaError):
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000,
                                 api_version_auto_timeout_ms=10_000, **kafka_python_options(sec))
        admin.close()
    # The preflight names the cause and the CA file instead of a bootstrap time-out.
    with pytest.raises(KafkaSecurityError) as e:
        preflight(broker.bootstrap, sec, timeout_s=8)
    assert not isinstance(e.value, KafkaUnreachable)
    assert "TLS handshake" in str(e.value) and f"not trusted by ssl_cafile {other_ca}" in str(e.value), str(e.value)


def test_the_preflight_clients_last_lines_after_a_verdict_stay_out_of_the_log(monkeypatch) -> None:
    """The verdict comes from the client's first SASL failure line; the client goes on until it gives
    up, and its "Connection lost" error line reached the service's log after the preflight had put
    the logger back (CI: a second error line beside ``kafka_preflight_failed``). A stand-in admin
    client logs the failure, waits until the preflight has returned, then logs once more."""
    import kafka

    returned, done = threading.Event(), threading.Event()
    client: list[str] = []

    class Admin:
        def __init__(self, client_id: str, **_: object) -> None:
            client.append(client_id)
            conn = logging.getLogger("kafka.net.connection")
            try:
                conn.error("<KafkaConnection node_id=bootstrap-0>: Authentication failed "
                           "(SaslAuthenticationFailedError)")
                returned.wait(10)
                conn.error("<KafkaConnection node_id=bootstrap-0 (disconnected)>: Connection lost: "
                           "SaslAuthenticationFailedError")
                raise KafkaError("Unable to bootstrap from the cluster")
            finally:
                done.set()

    class Capture(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.DEBUG)
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(f"{record.threadName} {record.name}: {record.getMessage()}")

    monkeypatch.setattr(kafka, "KafkaAdminClient", Admin)
    capture, root, kafka_log = Capture(), logging.getLogger(), logging.getLogger("kafka")
    root.addHandler(capture)
    try:
        sec = KafkaSecurity(protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", username="u", password="pw")
        with pytest.raises(KafkaSecurityError, match="rejected the login"):
            preflight("127.0.0.1:9", sec, timeout_s=5)
        returned.set()
        assert done.wait(10)
        for t in threading.enumerate():   # the stand-in's thread puts the logger back as it ends
            if t.name.startswith("opsloop-preflight-"):
                t.join(10)
    finally:
        root.removeHandler(capture)
    # (an earlier test's preflight client may still be giving up in this process: only this one's)
    assert [line for line in capture.lines if client[0] in line.split(" ")[0]] == []
    assert not [h for h in kafka_log.handlers if any(client[0] in t for t in getattr(h, "threads", ()))]
    preflights = ("opsloop-preflight-", "kafka-io-opsloop-preflight-")
    if not any(t.name.startswith(preflights) for t in threading.enumerate()):
        assert kafka_log.propagate   # no preflight client left in this process: the log is back


def test_no_broker_at_all_is_unreachable_not_a_settings_error(broker: SecureBroker) -> None:
    """A service that tolerates an outage (a collector spools) starts anyway: only a warning."""
    sec = security(broker, "scram")
    with pytest.raises(KafkaUnreachable, match="no broker answered"):
        preflight(f"127.0.0.1:{free_port()}", sec, timeout_s=3)


def test_preflight_or_exit_logs_one_line_and_exits_78(broker: SecureBroker) -> None:
    events: list[tuple[str, str, dict]] = []

    class Log:
        def __getattr__(self, level: str):
            return lambda event, **fields: events.append((level, event, fields))

    k = KafkaSettings(bootstrap_servers=broker.bootstrap, security=security(broker, "plain", password="bad-pw-1"))
    with pytest.raises(SystemExit) as e:
        preflight_or_exit(k, "test", Log(), timeout_s=8)
    assert e.value.code == 78   # EX_CONFIG: the units' RestartPreventExitStatus, no restart every 5 s
    assert [(lvl, ev) for lvl, ev, _ in events] == [("error", "kafka_preflight_failed")], events
    assert "bad-pw-1" not in str(events)
    events.clear()
    preflight_or_exit(k.model_copy(update={"security": security(broker, "plain")}), "test", Log(), timeout_s=30)
    assert [(lvl, ev) for lvl, ev, _ in events] == [("info", "kafka_preflight_ok")]
    events.clear()
    preflight_or_exit(KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"), "test", Log())  # PLAINTEXT
    assert events == []   # nothing to check: no password, no certificate


def test_topic_prefix_names_topics_groups_and_the_faust_app(tmp_path: Path) -> None:
    from opsloop.config import Settings
    from opsloop.topics import Topic
    from opsloop.streams.runtime.app import create_app, raw_topic

    k = KafkaSettings(topic_prefix="staging.")
    assert k.topic(Topic.FINDINGS) == "staging.findings" and k.group("opsloop-paging") == "staging.opsloop-paging"
    assert KafkaSettings().topic(Topic.AUDIT) == "audit"
    with pytest.raises(ValueError, match="topic_prefix"):
        KafkaSettings(topic_prefix="bad prefix/")
    settings = Settings.model_validate({"kafka": {"topic_prefix": "staging."},
                                        "stream": {"app_id": "opsloop-streams", "data_dir": str(tmp_path)}})
    app = create_app(settings)
    assert app.conf.id == "staging.opsloop-streams"   # its group id and its changelog topics' prefix
    assert raw_topic(app, Topic.LB, Topic.DEADLETTER).topics == ("staging.telemetry.lb", "staging.telemetry.deadletter")


def test_settings_are_checked_and_the_password_never_printed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="protocol SASL_SSL needs sasl_mechanism, username"):
        KafkaSecurity(protocol="SASL_SSL")
    with pytest.raises(ValueError, match="TLS files given but protocol is SASL_PLAINTEXT"):
        KafkaSecurity(protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", username="u", password="p", ssl_cafile=tmp_path)
    sec = KafkaSecurity(protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", username="u", password="hunter2-secret")
    assert "hunter2" not in repr(sec) and "hunter2" not in sec.model_dump_json()
    loose = tmp_path / "pw"
    loose.write_text("s3cret\n")
    loose.chmod(0o644)
    with pytest.raises(KafkaSecurityError, match="readable by others .* chmod 600"):
        read_secret_file(loose, "kafka.security.password_file")
    loose.chmod(0o600)
    assert KafkaSecurity(protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", username="u",
                         password_file=loose).secret() == "s3cret"


def test_the_password_from_the_environment_is_taken_verbatim(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPSLOOP__KAFKA__SECURITY__PASSWORD is not parsed as YAML: "0x1f" stays "0x1f", "yes" stays "yes"."""
    from opsloop.config import load_settings

    for raw in ("0x1f", "yes", "123456", " spaced: colon "):
        monkeypatch.setenv("OPSLOOP__KAFKA__SECURITY__PASSWORD", raw)
        s = load_settings(overrides={"kafka": {"security": {"protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                                                            "username": "u"}}}, discover=False)
        assert s.kafka.security.secret() == raw
