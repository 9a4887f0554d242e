"""The paging actuator's pure parts: finding -> alert mapping, the book (open / re-send / resolve),
decoding, back-off, and the delivery step against a fake Alertmanager client."""

from __future__ import annotations

import random
import re
import time
from datetime import datetime

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.controllers.paging.alertmanager import AlertmanagerError, Backoff, PostResult
from opsloop.controllers.paging.book import PagingBook
from opsloop.controllers.paging.config import PagingConfig, PagingConfigError, paging_config
from opsloop.controllers.paging.mapping import Links, alertname_for, annotations_for, label_name, labels_for
from opsloop.controllers.paging.service import PagingService
from opsloop.config import Settings
from opsloop.records import Finding, Severity
from opsloop.runbooks import finding_runbook_url
from tests.helpers import SentRecords

LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
T0 = 1_795_310_400.0


def finding(detector: str = "firewall.unprotected_port", severity: Severity = Severity.CRITICAL,
            cleared: bool = False, last_seen: float = T0, **where: str) -> Finding:
    return Finding(detector=detector, what="VM port without its security-group chain",
                   where=where or {"hypervisor": "hv-3", "vm": "web-1", "port": "p1"},
                   observed="chain absent", expected="chain present", severity=severity,
                   explanation="tap device reaches no neutron chain", first_seen=T0, last_seen=last_seen,
                   cleared=cleared, runbook="runbooks/firewall.md")


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# -- mapping ----------------------------------------------------------------------------------
@pytest.mark.parametrize("detector,name", [
    ("firewall.unprotected_port", "FirewallUnprotectedPort"),
    ("keystone.heavy_hitter", "KeystoneHeavyHitter"),
    ("power.generation_deviation", "PowerGenerationDeviation"),
    ("anomaly.ipmi-power", "AnomalyIpmiPower"),
    ("9lives", "Finding9lives"),
])
def test_alertname_from_detector(detector: str, name: str) -> None:
    assert alertname_for(detector) == name


def test_labels_identify_the_finding_and_keep_our_own_names() -> None:
    f = finding(hypervisor="hv-3", severity_x="1", alertname="evil", **{"port-id": "p1"})
    labels = labels_for(f)
    assert labels["alertname"] == "FirewallUnprotectedPort"
    assert labels["severity"] == "critical" and labels["signal"] == "firewall"
    assert labels["source"] == "opsloop-paging" and labels["hypervisor"] == "hv-3"
    assert labels["port_id"] == "p1"                     # sanitised name
    assert labels["where_alertname"] == "evil"            # cannot overwrite the alert name
    assert label_name("__meta") == "where_meta"


def test_annotations_say_observed_expected_and_link() -> None:
    a = annotations_for(finding(), Links("https://grafana.test", "https://rb.test/opsloop/"))
    assert a["summary"] == ("VM port without its security-group chain (hypervisor=hv-3, port=p1, vm=web-1): "
                            "observed chain absent, expected chain present")
    assert a["description"].startswith("Observed: chain absent. Expected: chain present.")
    # a relative runbook is replaced by the finding type's section in docs/runbooks
    assert a["runbook_url"] == finding_runbook_url("firewall.unprotected_port")
    assert a["runbook_url"].endswith("/firewall.md#firewall-unprotected-port")
    assert a["dashboard_url"] == ("https://grafana.test/d/opsloop-firewall/firewall-coverage"
                              "?var-hypervisor=hv-3&var-port=p1&var-vm=web-1")
    assert a["finding_id"] == finding().id


where_keys = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)


@settings(max_examples=150, deadline=None)
@given(detector=st.from_regex(r"[a-z][a-z0-9_.\-]{0,30}", fullmatch=True),
       where=st.dictionaries(where_keys, st.text(max_size=40), max_size=6),
       severity=st.sampled_from([Severity.WARNING, Severity.CRITICAL]))
def test_labels_are_valid_and_stable(detector: str, where: dict[str, str], severity: Severity) -> None:
    f = Finding(detector=detector, what="x", where=where, severity=severity, first_seen=T0, last_seen=T0)
    labels = labels_for(f)
    assert all(LABEL_NAME.match(k) for k in labels), labels
    assert LABEL_NAME.match(labels["alertname"])
    again = Finding(detector=detector, what="other text", where=dict(reversed(list(where.items()))),
                    severity=severity, observed=3.0, first_seen=T0, last_seen=T0 + 60)
    assert labels_for(again) == labels                    # same finding id -> same alert


# -- the book -----------------------------------------------------------------------------------
def book(**kw: object) -> PagingBook:
    return PagingBook(resend_interval_s=60, alert_ttl_s=240, **kw)  # type: ignore[arg-type]


def test_open_resend_resolve_lifecycle() -> None:
    b = book()
    now = T0 + 5
    assert [a.kind for a in b.apply(finding(), now)] == ["open"]
    due = b.due(now)
    assert len(due) == 1
    assert ts(due[0]["endsAt"]) == pytest.approx(now + 240, abs=0.01)   # firing: ends in the future
    assert ts(due[0]["startsAt"]) == pytest.approx(T0, abs=0.01)
    first, resolved, _ = b.delivered(now)
    assert [a.finding_id for a in first] == [finding().id] and resolved == 0
    assert b.due(now + 30) == []                                   # not yet time to re-send
    assert b.next_due(now + 30) == pytest.approx(30)
    # the detector re-publishes the same finding: a refresh, never a second page
    assert [a.kind for a in b.apply(finding(last_seen=T0 + 40), now + 40)] == ["refresh"]
    assert b.due(now + 40) == []
    resend = b.due(now + 61)
    assert len(resend) == 1 and resend[0]["labels"] == due[0]["labels"]
    assert ts(resend[0]["endsAt"]) == pytest.approx(now + 61 + 240, abs=0.01)
    first = b.delivered(now + 61).first
    assert first == []                                             # a re-send is not a new page
    # cleared: a resolve with endsAt = now, re-sent with that endsAt at the re-send interval for
    # resend_resolved_s (15 min), then nothing
    assert [a.kind for a in b.apply(finding(cleared=True), now + 70)] == ["resolve"]
    out = b.due(now + 70)
    assert len(out) == 1 and ts(out[0]["endsAt"]) == pytest.approx(now + 70, abs=0.01)
    assert out[0]["labels"] == due[0]["labels"]
    assert b.delivered(now + 70)[1] == 1
    assert b.due(now + 100) == [] and b.open == {} and b.next_due(now + 100) == pytest.approx(30)
    again = b.due(now + 130)
    assert [(a["labels"], a["endsAt"]) for a in again] == [(out[0]["labels"], out[0]["endsAt"])]
    assert b.delivered(now + 130)[1] == 0                          # a re-send: no resolve counted again
    assert b.due(now + 70 + 900) == [] and b.next_due(now + 70 + 900) == float("inf")


def test_undelivered_alert_stays_due() -> None:
    b = book()
    b.apply(finding(), T0)
    assert len(b.due(T0)) == 1
    assert len(b.due(T0 + 1)) == 1          # delivery failed (delivered() not called): still due
    assert b.next_due(T0 + 1) == 0


def test_severity_change_resolves_the_old_alert_and_opens_the_new() -> None:
    b = book()
    b.apply(finding(severity=Severity.WARNING), T0)
    b.delivered(T0)
    actions = b.apply(finding(severity=Severity.CRITICAL), T0 + 10)
    assert [a.kind for a in actions] == ["severity_changed"]
    due = b.due(T0 + 10)
    by_sev = {d["labels"]["severity"]: d for d in due}
    assert set(by_sev) == {"warning", "critical"}
    assert ts(by_sev["warning"]["endsAt"]) == pytest.approx(T0 + 10, abs=0.01)      # resolved
    assert ts(by_sev["critical"]["endsAt"]) > T0 + 10                                 # firing


def test_info_findings_never_page_and_demotion_resolves() -> None:
    b = book()
    assert [a.kind for a in b.apply(finding(severity=Severity.INFO), T0)] == ["ignore"]
    assert b.due(T0) == []
    b.apply(finding(severity=Severity.WARNING), T0)
    assert [a.kind for a in b.apply(finding(severity=Severity.INFO), T0 + 5)] == ["resolve"]
    assert b.open == {}


def test_min_severity_critical_ignores_warnings() -> None:
    b = book(min_severity=Severity.CRITICAL)
    assert [a.kind for a in b.apply(finding(severity=Severity.WARNING), T0)] == ["ignore"]
    assert [a.kind for a in b.apply(finding(severity=Severity.CRITICAL), T0)] == ["open"]


def test_clear_of_unknown_finding_still_sends_one_resolve() -> None:
    b = book()
    assert [a.kind for a in b.apply(finding(cleared=True), T0)] == ["resolve"]
    assert len(b.due(T0)) == 1
    b.apply(finding(cleared=True), T0 + 1)      # repeated clears: still one pending resolve
    assert len(b.due(T0 + 1)) == 1


def test_state_round_trip_resends_at_once_without_a_new_page() -> None:
    b = book()
    b.apply(finding(), T0)
    b.delivered(T0)
    b.apply(finding(hypervisor="hv-9"), T0)
    b.apply(finding(hypervisor="hv-9", cleared=True), T0 + 1)
    restored = book()
    restored.restore(orjson.loads(orjson.dumps(b.to_dict())))
    assert set(restored.open) == set(b.open)
    assert len(restored.due(T0 + 2)) == 2              # the open alert (re-sent) + the pending resolve
    first, resolved, _ = restored.delivered(T0 + 2)
    assert first == [] and resolved == 1               # delivered before the restart: not a new page
    with pytest.raises(ValueError, match="unsupported version"):
        restored.restore({"version": 99})


@pytest.mark.parametrize("entry, field, value", [
    ("open", "starts_at", -1e13), ("open", "event_time", 1e15), ("open", "last_seen", -1.0),
    ("resolves", "ends_at", 3e11), ("resolves", "starts_at", float("inf")),
])
def test_a_saved_time_no_alert_can_carry_is_refused_by_name(entry: str, field: str, value: float) -> None:
    """A finite time outside what RFC 3339 stamps hold loaded, and every due() after it raised: paging stalled."""
    b = book()
    b.apply(finding(), T0)
    b.delivered(T0)
    b.apply(finding(hypervisor="hv-9"), T0)
    b.apply(finding(hypervisor="hv-9", cleared=True), T0 + 1)
    doc = orjson.loads(orjson.dumps(b.to_dict()))
    doc[entry][0][field] = value
    restored = book()
    with pytest.raises(ValueError, match=rf"{entry}\[0\]\.{field} is .*not a time"):
        restored.restore(doc)
    assert restored.due(T0 + 2) == [] and not restored.open   # refused whole: the book as it was, still working
    doc[entry][0][field] = T0                                  # the same file with a time an alert can carry
    restored.restore(doc)
    assert len(restored.due(T0 + 2)) == 2


# -- decoding --------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,message", [
    (b"", "empty record"),
    (b"{not json", "not JSON"),
    (b"[1, 2]", "finding: expected a JSON object, got list"),
    (orjson.dumps({"detector": "x", "what": "y", "first_seen": T0}), "last_seen"),
    (orjson.dumps({"detector": "", "what": "y", "first_seen": T0, "last_seen": T0}), "detector"),
    (orjson.dumps({"detector": "x", "what": "y", "first_seen": T0, "last_seen": T0, "severity": "page-me"}),
     "severity"),
])
def test_bad_records_are_named(raw: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Finding.decode(raw)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.dictionaries(st.sampled_from(["detector", "what", "first_seen", "last_seen", "where",
                                                  "severity", "cleared", "id", "score"]),
                                 st.one_of(st.none(), st.text(max_size=10), st.floats(allow_nan=True),
                                           st.integers(-2**53, 2**53), st.lists(st.integers(0, 9), max_size=2),
                                           st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2)))
                 .map(orjson.dumps)))
def test_decode_never_crashes(raw: bytes) -> None:
    try:
        f = Finding.decode(raw)
    except ValueError:
        return
    assert f.detector and f.what


def test_decode_round_trip() -> None:
    f = finding()
    assert Finding.decode(f.encode()) == f


# -- back-off and config -------------------------------------------------------------------------
def test_backoff_doubles_to_a_cap_and_resets() -> None:
    b = Backoff(initial_s=1.0, max_s=8.0, rng=random.Random(7))
    delays = [b.failed(100.0) for _ in range(6)]
    caps = [1, 2, 4, 8, 8, 8]
    assert all(c / 2 <= d <= c for d, c in zip(delays, caps)), delays
    assert not b.ready(100.0) and b.ready(100.0 + delays[-1])
    b.succeeded()
    assert b.ready(100.0) and b.failures == 0


def test_config_errors_name_the_field() -> None:
    with pytest.raises(PagingConfigError, match="alertmanager_urls.*ftp://x"):
        paging_config(Settings(controllers={"paging": {"alertmanager_urls": ["ftp://x"]}}))
    with pytest.raises(PagingConfigError, match="ends_after_s"):
        paging_config(Settings(controllers={"paging": {"resend_interval_s": 60, "ends_after_s": 30}}))
    with pytest.raises(PagingConfigError, match="resend_intervl_s"):
        paging_config(Settings(controllers={"paging": {"resend_intervl_s": 5}}))
    cfg = paging_config(Settings(), {"group_id": "g2", "metrics_port": None})
    assert cfg.group_id == "g2" and cfg.metrics_port == 29103 and cfg.alert_ttl_s == 240


# -- the delivery step with a fake Alertmanager ------------------------------------------------
class FlakyClient:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.bodies: list[list[dict]] = []

    def post(self, alerts: list[dict]) -> PostResult:
        if self.failures > 0:
            self.failures -= 1
            raise AlertmanagerError("http://127.0.0.1:1: connection refused")
        self.bodies.append(alerts)
        return PostResult(accepted=len(alerts))

    def close(self) -> None:
        pass


def test_delivery_backs_off_while_alertmanager_is_down(tmp_path) -> None:
    cfg = PagingConfig(state_file=tmp_path / "state.json", backoff_initial_s=1, backoff_max_s=4,
                       start_offset="latest")
    client = FlakyClient(failures=2)
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=None, client=client)  # type: ignore[arg-type]
    svc.handle_records([finding().encode()], T0)
    assert svc.deliver(T0) == 0                       # refused: back off
    assert svc.deliver(T0 + 0.1) == 0 and client.failures == 1   # backing off: no attempt at all
    t = T0 + svc.backoff.wait(T0) + 0.01
    assert svc.deliver(t) == 0 and client.failures == 0          # second attempt, refused again
    t2 = t + svc.backoff.wait(t) + 0.01
    assert svc.deliver(t2) == 1
    assert client.bodies[0][0]["labels"]["alertname"] == "FirewallUnprotectedPort"
    assert svc.backoff.failures == 0
    svc.save_state()
    assert orjson.loads((tmp_path / "state.json").read_bytes())["open"][0]["delivered_once"] is True


# -- oversized findings, per-record errors, durable state, credentials in URLs ---------------------
def oversized_findings() -> list[Finding]:
    many = finding(**{f"label_{i:02d}": f"v{i}" for i in range(27)})
    long_name = finding(detector="power." + "x" * 289)
    assert len(long_name.detector) == 295
    return [many, long_name]


def test_one_oversized_finding_does_not_stop_paging_for_the_batch(tmp_path) -> None:
    """Before: the audit record (32 labels, 300-character target) raised outside any try: the whole
    batch was lost and the step failed again on every retry."""
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest")
    producer = SentRecords()
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=producer,  # type: ignore[arg-type]
                        client=FlakyClient(0))
    svc.auditor.producer = producer
    normal = finding(hypervisor="hv-ok", vm="vm-ok", port="p-ok")
    actions = svc.handle_records([f.encode() for f in (*oversized_findings(), normal)], T0)
    assert [a.kind for a in actions] == ["open", "open", "open"]
    audits = [orjson.loads(v) for t, _, v in producer.records if t == cfg.audit_topic]
    assert len(audits) == 3 and all(len(a["labels"]) <= 32 and len(a["target"]) <= 300 for a in audits)
    assert svc.deliver(T0) == 3


def test_labels_are_cut_to_alertmanager_safe_sizes_saying_what_was_cut() -> None:
    many, long_name = oversized_findings()
    labels = labels_for(many)
    assert len(labels) == 20 + 5 and labels["label_00"] == "v0" and "label_26" not in labels
    notes = annotations_for(many, Links())["labels_truncated"]
    assert "dropped 7 where-labels" in notes and "label_26" in notes
    long_labels = labels_for(long_name)
    assert len(long_labels["alertname"]) <= 120 and len(long_labels["detector"]) <= 256
    assert "alertname" in annotations_for(long_name, Links())["labels_truncated"]
    other = finding(detector="power." + "x" * 288 + "y")    # differs only past the cut: another alert
    assert labels_for(other)["alertname"] != long_labels["alertname"]
    assert "labels_truncated" not in annotations_for(finding(), Links())
    assert all(LABEL_NAME.match(k) for k in labels)


CLASHING = {"a-b": "dash", "a_b": "underscore", "a.b": "dot", "alertname": "evil", "where_alertname": "own",
            "x" * 150: "long-1", "x" * 149 + "-": "long-2"}


def test_where_keys_that_clean_to_one_label_name_each_keep_their_value() -> None:
    """Before: ``a-b``, ``a.b`` and ``a_b`` all became ``a_b`` and the last one overwrote the others."""
    f = finding(**CLASHING)
    labels = labels_for(f)
    where = {k: v for k, v in labels.items() if k not in ("alertname", "severity", "signal", "detector", "source")}
    assert sorted(where.values()) == sorted(CLASHING.values())          # every value, once
    assert labels["a_b"] == "underscore" and labels["where_alertname"] == "own"   # a valid key keeps its name
    assert all(LABEL_NAME.match(k) and len(k) <= 100 for k in labels)
    renamed = {k for k, v in where.items() if v in ("dash", "dot", "evil")}
    assert all(re.fullmatch(r"(a_b|where_alertname)_[0-9a-f]{8}", k) for k in renamed) and len(renamed) == 3
    # the same where in any order: the same labels (one alert in Alertmanager)
    assert labels_for(finding(**dict(reversed(list(CLASHING.items()))))) == labels
    note = annotations_for(f, Links())["labels_truncated"]
    assert "renamed a-b to a_b_" in note and "renamed a.b to a_b_" in note


@pytest.mark.integration
def test_clashing_where_keys_page_as_one_alert_with_every_value(test_alertmanager) -> None:
    from opsloop.controllers.paging.alertmanager import AlertmanagerClient
    from tests.alerting import am_url
    from tests.helpers import unique

    hv, now = unique("hv-clash"), time.time()
    book = PagingBook()
    book.apply(finding(hypervisor=hv, **CLASHING).model_copy(update={"first_seen": now, "last_seen": now}), now)
    client = AlertmanagerClient([am_url(test_alertmanager)])
    try:
        result = client.post(book.due(now))
        got = client.session.get(f"{am_url(test_alertmanager)}/api/v2/alerts",
                                 params={"filter": f'hypervisor="{hv}"'}, timeout=5).json()
    finally:
        client.close()
    assert result.accepted == 1 and result.rejected == []
    assert len(got) == 1 and set(CLASHING.values()) <= set(got[0]["labels"].values())


@pytest.mark.integration
def test_oversized_findings_are_accepted_by_a_real_alertmanager(test_alertmanager) -> None:
    from opsloop.controllers.paging.alertmanager import AlertmanagerClient
    from opsloop.controllers.paging.book import PagingBook
    from tests.alerting import am_url

    book = PagingBook()
    for f in oversized_findings():
        book.apply(f, T0)
    alerts = book.due(T0)
    client = AlertmanagerClient([am_url(test_alertmanager)])
    try:
        result = client.post(alerts)
    finally:
        client.close()
    assert result.accepted == 2 and result.rejected == []


def test_a_finding_the_book_cannot_map_is_dead_lettered_alone(tmp_path, monkeypatch) -> None:
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest")
    producer = SentRecords()
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=producer,  # type: ignore[arg-type]
                        client=FlakyClient(0))
    real_apply = svc.book.apply

    def apply(f: Finding, now: float):  # type: ignore[no-untyped-def]
        if f.where.get("hypervisor") == "hv-bug":
            raise RuntimeError("mapping bug")
        return real_apply(f, now)

    monkeypatch.setattr(svc.book, "apply", apply)
    bad, good = finding(hypervisor="hv-bug", vm="v", port="p"), finding(hypervisor="hv-fine", vm="v", port="p")
    actions = svc.handle_records([bad.encode(), good.encode()], T0, [(0, 1, b"k1"), (0, 2, b"k2")])
    assert [a.finding_id for a in actions] == [good.id]
    dls = [orjson.loads(v) for t, _, v in producer.records if t == "telemetry.deadletter"]
    assert len(dls) == 1 and "mapping bug" in dls[0]["reason"] and dls[0]["offset"] == 1


def test_paging_state_is_fsynced_file_and_directory(tmp_path, monkeypatch) -> None:
    import os
    import stat

    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest")
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=None,  # type: ignore[arg-type]
                        client=FlakyClient(0))
    svc.handle_records([finding().encode()], T0)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    svc.save_state()
    assert synced == ["file", "dir"]
    assert orjson.loads((tmp_path / "state.json").read_bytes())["open"]


def test_credentials_in_alertmanager_urls_never_reach_a_log_line(capsys) -> None:
    import io
    import socket

    from opsloop.controllers.paging.alertmanager import AlertmanagerClient
    from opsloop.log import setup_logging

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://pager:hunter2-s3cret@127.0.0.1:{port}"
    client = AlertmanagerClient([url], timeout_s=1.0)
    with pytest.raises(AlertmanagerError) as err:
        client.post([{"labels": {"alertname": "X"}}])
    client.close()
    assert "hunter2" not in str(err.value) and "***@127.0.0.1" in str(err.value)
    import logging

    out = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    setup_logging("test-redact", stream=out)
    try:
        log_lines(url)
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    text = out.getvalue()
    assert "hunter2" not in text and "p@ss" not in text and "ss@es" not in text
    assert text.count("***@") >= 3


def log_lines(url: str) -> None:
    from opsloop.log import get_logger

    log = get_logger("paging.test")
    log.info("paging_started", alertmanagers=[url, "https://es:p@ss@es.example:9200/"])
    try:
        raise RuntimeError(f"could not reach {url}/api/v2/alerts")
    except RuntimeError:
        log.error("step_failed", exc_info=True)
