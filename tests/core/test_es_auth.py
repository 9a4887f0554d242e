"""Elasticsearch behind TLS and authentication: host list, basic auth or API key from a 0600 file or the
environment, a CA made in the test; credentials never in a URL that reaches a message or a log.

The Elasticsearch build the tests run has no security module, so authentication and TLS are done the way
many deployments put them in front of a cluster: a real HAProxy terminating TLS (certificate from a CA
made with openssl in the test) and checking basic auth (a userlist) or an ``Authorization: ApiKey``
header, forwarding to the real Elasticsearch. What the client sends is therefore checked by a real
server; the records land in the real Elasticsearch.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import requests
from elasticsearch import Elasticsearch

from opsloop.audit.trail import AuditLog
from opsloop.audit.indexer import ElasticsearchIndexer, client_for
from opsloop.audit.settings import AuditSettings
from opsloop.config import ConfigError, load_settings
from opsloop.es_client import ElasticsearchSettings
from opsloop.kafka_security import KafkaSecurityError
from opsloop.log import setup_logging
from opsloop.stack import ManagedProcess, free_port
from opsloop.stack.process import require_binary
from tests.helpers import REPO, unique, wait_until, write_config
from tests.kafka_secure import make_ca_and_broker_cert

pytestmark = pytest.mark.integration

USER, PASSWORD = "opsloop-audit", "es-pass-8d1f0c"
API_KEY = "b3BzbG9vcC1rZXk6c2VjcmV0LWtleS0yNzE4"   # an "encoded" key as Elasticsearch hands it out


class AuthProxy:
    """HAProxy: TLS with the test CA's certificate, basic auth or API key required, then Elasticsearch."""

    def __init__(self, workdir: Path, es_url: str) -> None:
        self.ca, keystore = make_ca_and_broker_cert(workdir / "tls")
        self.port = free_port()
        es_port = int(es_url.rsplit(":", 1)[1])
        cfg = workdir / "haproxy.cfg"
        cfg.write_text(f"""global
    log stderr format raw local0 warning
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
userlist es_users
    user {USER} insecure-password {PASSWORD}
frontend es_tls
    bind 127.0.0.1:{self.port} ssl crt {keystore}
    acl basic_ok http_auth(es_users)
    acl key_ok req.hdr(authorization) -m str "ApiKey {API_KEY}"
    http-request return status 401 content-type application/json string "{{\\"error\\":\\"unauthorized\\",\\"status\\":401}}" hdr WWW-Authenticate "Basic realm=es" unless basic_ok or key_ok
    default_backend es
backend es
    http-request del-header authorization
    server es 127.0.0.1:{es_port}
""")
        self.proc = ManagedProcess(name="es-auth-proxy", argv=[require_binary("haproxy", "make setup"), "-db", "-f",
                                                               str(cfg)],
                                   workdir=workdir, ports={"https": ("127.0.0.1", self.port)},
                                   ready=self._ready, ready_timeout_s=30)

    def _ready(self) -> bool:
        return requests.get(self.url, verify=str(self.ca), timeout=1).status_code == 401

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def proxy(es_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthProxy]:
    p = AuthProxy(tmp_path_factory.mktemp("es-auth"), es_url)
    p.proc.start()
    try:
        yield p
    finally:
        p.proc.stop()


def secret_file(path: Path, secret: str, mode: int = 0o600) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, mode)   # the umask may have narrowed it: the test wants exactly this mode
    return path


def count(es_url: str, stream: str, audit_id: str) -> int:
    es = Elasticsearch(es_url, request_timeout=10)
    try:
        es.indices.refresh(index=stream)
        return int(es.count(index=stream, query={"term": {"id": audit_id}})["count"])
    except Exception:  # noqa: BLE001 - the data stream does not exist before the first record
        return 0


def push(audit: AuditLog, edge: str):
    return audit.record(actor="controller.edge", action="edge.weights.push", target=f"haproxy:{edge}/app",
                        edge=edge, listener="app", version=1, before={"eu": 1.0}, after={"eu": 0.5},
                        reason="secured indexing", mode="live", result="applied")


def test_basic_auth_from_a_0600_file_over_tls_indexes_records(proxy: AuthProxy, es_url: str, tmp_path: Path) -> None:
    stream = unique("opsloop-audit-tls")
    pw = secret_file(tmp_path / "es-password", PASSWORD)
    settings = load_settings(overrides={"audit": {"stream": stream, "elasticsearch": {
        "hosts": [proxy.url], "username": USER, "password_file": str(pw), "ca_file": str(proxy.ca)}}},
        discover=False)
    audit = AuditLog.from_settings(settings)
    try:
        rec = push(audit, unique("ams"))
        wait_until(lambda: count(es_url, stream, rec.id) == 1, timeout=60, what="the record in Elasticsearch")
    finally:
        audit.close()


def test_an_api_key_from_the_environment_reaches_elasticsearch(proxy: AuthProxy, es_url: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    stream = unique("opsloop-audit-key")
    monkeypatch.setenv("OPSLOOP__AUDIT__ELASTICSEARCH__API_KEY", API_KEY)
    settings = load_settings(overrides={"audit": {"stream": stream, "elasticsearch": {
        "hosts": [proxy.url], "ca_file": str(proxy.ca)}}}, discover=False)
    es = AuditSettings.from_settings(settings).es()
    assert es is not None and API_KEY not in repr(es) and API_KEY not in es.model_dump_json()
    indexer = ElasticsearchIndexer(client_for(es), stream).start()
    audit = AuditLog([indexer])
    try:
        rec = push(audit, unique("fra"))
        wait_until(lambda: count(es_url, stream, rec.id) == 1, timeout=60, what="the record in Elasticsearch")
    finally:
        audit.close()


def test_a_wrong_password_or_untrusted_ca_is_refused_and_never_printed(proxy: AuthProxy, tmp_path: Path) -> None:
    wrong = "wrong-es-password-77"
    bad = ElasticsearchSettings(hosts=[proxy.url], username=USER, password_file=secret_file(tmp_path / "pw", wrong),
                                ca_file=proxy.ca)
    with pytest.raises(Exception) as e:
        bad.client().info()
    assert "401" in str(e.value) and wrong not in str(e.value)
    untrusted = ElasticsearchSettings(hosts=[proxy.url], username=USER, password=PASSWORD,
                                      ca_file=make_ca_and_broker_cert(tmp_path / "other")[0])
    with pytest.raises(Exception) as e:
        untrusted.client().info()
    assert "CERTIFICATE_VERIFY_FAILED" in str(e.value) and PASSWORD not in str(e.value)
    # The CLI says where and why, exit 2, no secret in its output.
    config = write_config(tmp_path / "opsloop.yaml", {"audit": {"elasticsearch": {
        "hosts": [proxy.url], "username": USER, "password_file": str(tmp_path / "pw"), "ca_file": str(proxy.ca)}}})
    r = subprocess.run([sys.executable, "-m", "opsloop.audit.cli", "search", "--edge", "ams",
                        "--at", "2026-11-22T03:12", "--config", str(config)], capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2, r.stderr
    assert f"Elasticsearch at {proxy.url}" in r.stderr and "401" in r.stderr, r.stderr
    assert wrong not in r.stderr + r.stdout


def test_settings_refuse_credentials_in_urls_loose_files_and_two_auths(tmp_path: Path) -> None:
    secret = "pa55-in-url"
    with pytest.raises(ConfigError) as e:
        load_settings(overrides={"audit": {"elasticsearch": {"hosts": [f"https://ops:{secret}@es1:9200"]}}},
                      discover=False)
    assert "audit.elasticsearch.hosts: hosts[0]: credentials in the URL are refused" in str(e.value), str(e.value)
    assert secret not in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_settings(overrides={"audit": {"elasticsearch_url": f"http://ops:{secret}@es1:9200"}}, discover=False)
    assert "credentials in the URL are refused" in str(e.value) and secret not in str(e.value)
    # A validator that quotes the bad value (the paging actuator's URL check) is masked too.
    with pytest.raises(ConfigError) as e:
        load_settings(overrides={"controllers": {"paging": {"alertmanager_urls": [f"ftp://pager:{secret}@am:9093"]}}},
                      discover=False)
    assert "controllers.paging.alertmanager_urls" in str(e.value) and "ftp://***@am:9093" in str(e.value)
    assert secret not in str(e.value), str(e.value)
    from opsloop.controllers.paging.config import PagingConfigError, paging_config

    with pytest.raises(PagingConfigError) as e:   # `opsloop page run --alertmanager URL` checks it this way
        paging_config(load_settings(discover=False), {"alertmanager_urls": [f"ftp://pager:{secret}@am:9093"]})
    assert "ftp://***@am:9093" in str(e.value) and secret not in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="not both"):
        load_settings(overrides={"audit": {"elasticsearch": {"hosts": ["https://es1:9200"], "api_key": "k",
                                                             "username": "u", "password": "p"}}}, discover=False)
    loose = secret_file(tmp_path / "loose", "x", mode=0o644)
    es = ElasticsearchSettings(hosts=["https://es1:9200"], api_key_file=loose)
    with pytest.raises(KafkaSecurityError, match=r"elasticsearch.api_key_file .* readable by others \(mode 0644\)"):
        es.client_options()


def test_user_and_password_in_any_logged_url_are_masked(tmp_path: Path) -> None:
    """Alertmanager and Elasticsearch URLs with user:password@ in a log line (the paging actuator logged
    its Alertmanager URLs at start and in connection errors) come out masked, whoever logs them."""
    from opsloop.controllers.paging.alertmanager import AlertmanagerClient, AlertmanagerError

    url = f"http://pager:hunter2-s3cret@127.0.0.1:{free_port()}"
    out = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    setup_logging("test-es-redact", stream=out)
    try:
        client = AlertmanagerClient([url], timeout_s=1.0)
        with pytest.raises(AlertmanagerError) as err:
            client.post([{"labels": {"alertname": "X"}}])
        client.close()
        from opsloop.log import get_logger

        get_logger("paging").error("delivery_failed", error=str(err.value), alertmanagers=[url])
        logging.getLogger("elastic_transport.transport").warning("node https://es:p@ss@es1:9200 failed")
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    text = out.getvalue()
    assert "hunter2" not in text and "p@ss" not in text, text
    assert text.count("***@") >= 3, text
