"""What paging's own side outputs (the state file, the audit topic) must never do: stop or hold up the pages.

* A state file that cannot be written (disk full, read-only; here a directory where its temporary file goes,
  EISDIR as ENOSPC or EROFS would be): the save raised before the post at every step, so no page, re-send or
  resolve went out, the open alerts expired in Alertmanager at their endsAt, and nothing alerted (the loop still
  polled, so OpsloopPagingActuatorStuck stayed quiet). Now the step delivers anyway, counts and logs each failed
  save, and holds the offsets until a save succeeds.
* An audit record the broker refuses (over the topic's ``max.message.bytes`` here; a write ACL or a leaderless
  partition alike): the send's future failed on the producer's thread and nothing counted or logged it, so
  OpsloopAuditTopicLosingRecords could not fire.

Real Kafka and the real Alertmanager of the tests; each test its own topic prefix.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition

from opsloop.config import KafkaSettings
from opsloop.records import Finding, Severity
from opsloop.stack import ManagedProcess
from opsloop.topics import Topic
from opsloop.log import Sampled
from opsloop.controllers.paging import audit as audit_module, metrics, service as service_module
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from tests.alerting import am_url
from tests.helpers import captured_logs, create_topics, read_topic, unique, wait_until

pytestmark = pytest.mark.integration


def page(hv: str, what: str = "VM port without its security-group chain", cleared: bool = False,
         first_seen: float | None = None) -> Finding:
    now = time.time()
    return Finding(detector="firewall.unprotected_port", what=what, where={"hypervisor": hv, "vm": "web-1"},
                   observed="chain absent", expected="chain present", severity=Severity.CRITICAL,
                   first_seen=first_seen or now, last_seen=now, cleared=cleared)


def publish(bootstrap: str, topic: str, *findings: Finding) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for f in findings:
            producer.send(topic, key=f.id.encode(), value=f.encode())
        producer.flush()
    finally:
        producer.close()


def firing(am: ManagedProcess, run: str) -> set[str]:
    """The hypervisors of this run's alerts Alertmanager holds firing."""
    r = requests.get(f"{am_url(am)}/api/v2/alerts", params={"filter": f'hypervisor=~"{run}-.*"', "active": "true",
                                                             "silenced": "true", "inhibited": "true"}, timeout=5)
    r.raise_for_status()
    return {a["labels"]["hypervisor"] for a in r.json() if a["status"]["state"] != "resolved"}


def committed(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offset of partition 0 (-1: none)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        meta = admin.list_group_offsets(group).get(group, {}).get(TopicPartition(topic, 0))
    finally:
        admin.close()
    return meta.offset if meta is not None else -1


def config(tmp_path: Path, am: ManagedProcess) -> PagingConfig:
    return PagingConfig(state_file=tmp_path / "state.json", alertmanager_urls=[am_url(am)],
                        group_id=unique("paging-side"), resend_interval_s=60, poll_timeout_s=0.2)


def failures(counter: Any) -> float:
    return counter._value.get()


# -- the state file --------------------------------------------------------------------------------------------
def test_paging_goes_on_while_the_state_file_cannot_be_written(tmp_path: Path, kafka_bootstrap: str,
                                                               test_alertmanager: ManagedProcess,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "SAVE_LOG", Sampled(60.0), raising=False)   # its first line, whatever ran
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique("unsaved") + ".")
    findings = kafka.topic(Topic.FINDINGS)
    create_topics(kafka_bootstrap, findings, kafka.topic(Topic.AUDIT))
    cfg = config(tmp_path, test_alertmanager)
    group = kafka.group(cfg.group_id)
    svc = PagingService(cfg, kafka)
    blocked = cfg.state_file.with_name(cfg.state_file.name + ".tmp")
    blocked.mkdir()   # where every save writes first: each one fails
    run, saves_failed = unique("hv"), failures(metrics.STATE_SAVE_FAILURES)
    opened = page(f"{run}-1")
    stop = threading.Event()
    loop = threading.Thread(target=svc.run, args=(stop,), daemon=True)
    with captured_logs() as logs:
        loop.start()
        try:
            publish(kafka_bootstrap, findings, opened)
            wait_until(lambda: firing(test_alertmanager, run) == {f"{run}-1"}, timeout=30,
                       what="the page delivered while the state cannot be saved")
            assert failures(metrics.STATE_SAVE_FAILURES) > saves_failed
            assert not cfg.state_file.exists()
            # the record is in no saved state: its offset is not committed (a crash replays it)
            assert committed(kafka_bootstrap, group, findings) < 1

            publish(kafka_bootstrap, findings, page(f"{run}-1", cleared=True, first_seen=opened.first_seen))
            wait_until(lambda: firing(test_alertmanager, run) == set(), timeout=30, what="the resolve delivered")

            blocked.rmdir()   # the disk has room again: saved, then committed
            wait_until(lambda: committed(kafka_bootstrap, group, findings) == 2, timeout=30,
                       what="the offsets committed after the first save")
        finally:
            stop.set()
            loop.join(timeout=30)
    assert not loop.is_alive()
    saved = orjson.loads(cfg.state_file.read_bytes())
    assert saved["open"] == [] and [m[0] for m in saved["cleared"]] == [opened.id]
    [line, *_] = [ln for ln in logs.lines if ln.startswith("state_save_failed")]
    assert str(cfg.state_file) in line and "Is a directory" in line


# -- the audit topic -------------------------------------------------------------------------------------------
def test_an_audit_record_the_broker_refuses_is_counted_and_logged(tmp_path: Path, kafka_bootstrap: str,
                                                                  test_alertmanager: ManagedProcess,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit_module, "FAIL_LOG", Sampled(60.0), raising=False)   # its first line, whatever ran before
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique("auditrefused") + ".")
    findings, audit = kafka.topic(Topic.FINDINGS), kafka.topic(Topic.AUDIT)
    create_topics(kafka_bootstrap, findings)
    create_topics(kafka_bootstrap, audit, max_message_bytes=1024)
    svc = PagingService(config(tmp_path, test_alertmanager), kafka)
    svc._connect()
    run, lost = unique("hv"), failures(metrics.AUDIT_FAILURES)
    try:
        # page_opened's reason is the summary: over 1 KB with this `what`, refused; page_delivered's fits
        publish(kafka_bootstrap, findings, page(f"{run}-1", what="long " * 300))
        with captured_logs() as logs:
            wait_until(lambda: (svc.step(), failures(metrics.AUDIT_FAILURES) > lost)[1], timeout=60,
                       what="the refused audit record counted")
            svc.auditor.flush()
        assert firing(test_alertmanager, run) == {f"{run}-1"}
        assert failures(metrics.AUDIT_FAILURES) - lost == 1
        [line] = [ln for ln in logs.lines if ln.startswith("audit_write_failed")]
        assert audit in line and "page_opened" in line
        assert [orjson.loads(r.value)["action"] for r in read_topic(kafka_bootstrap, audit)] == ["page_delivered"]
    finally:
        svc.close()
