"""Alert rules and Alertmanager config checked with the real promtool and amtool.

`promtool check rules`, `promtool test rules` (every rule covered, and a wrong expectation must fail),
`amtool check-config` (the committed and the rendered config), routing with `amtool config routes
test`, and the conventions every alert follows (runbook_url, dashboard_url, observed vs expected).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from opsloop.controllers.paging.amconfig import render_alertmanager_config
from opsloop.runbooks import DEFAULT_DASHBOARD_BASE_URL, DEFAULT_RUNBOOK_BASE_URL, alert_anchor
from tests.helpers import REPO

ALERTS = REPO / "alerts"
RULE_FILES = sorted((ALERTS / "rules").glob("*.yml"))
TEST_FILES = sorted((ALERTS / "tests").glob("*.yml"))


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=240, cwd=REPO)


def rules() -> list[dict]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


def alerting_rules() -> list[dict]:
    return [r for r in rules() if "alert" in r]


@pytest.mark.integration
def test_promtool_check_rules() -> None:
    r = run("promtool", "check", "rules", *RULE_FILES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(RULE_FILES)


@pytest.mark.integration
def test_promtool_unit_tests_pass() -> None:
    r = run("promtool", "test", "rules", *TEST_FILES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(TEST_FILES)


@pytest.mark.parametrize("old,new,named", [
    ('description: "Observed: 600 dead-lettered', 'description: "Observed: 601 dead-lettered',
     "OpsloopDeadLetterGrowing"),                                                                # wrong value
    ("exp_labels: {severity: critical, signal: pipeline, collector: ipmi}\n",
     "exp_labels: {severity: warning, signal: pipeline, collector: ipmi}\n", "OpsloopCollector"),  # wrong label
    ("      - eval_time: 3m            # down since 2m: still pending\n        alertname: OpsloopTargetDown\n"
     "        exp_alerts: []",
     "      - eval_time: 3m            # down since 2m: still pending\n        alertname: OpsloopTargetDown\n"
     "        exp_alerts: [{exp_labels: {severity: critical}}]", "OpsloopTargetDown"),            # still pending
])
@pytest.mark.integration
def test_promtool_fails_on_a_wrong_expectation(tmp_path: Path, old: str, new: str, named: str) -> None:
    shutil.copytree(ALERTS / "rules", tmp_path / "rules")
    (tmp_path / "tests").mkdir()
    text = (ALERTS / "tests" / "pipeline_test.yml").read_text()
    assert old in text, "the test file changed: update the mutation"
    (tmp_path / "tests" / "pipeline_test.yml").write_text(text.replace(old, new, 1))
    r = run("promtool", "test", "rules", tmp_path / "tests" / "pipeline_test.yml")
    assert r.returncode == 1
    out = r.stdout + r.stderr
    assert "FAILED" in out and f"alertname: {named}" in out


@pytest.mark.integration
def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text((ALERTS / "rules" / "edge.yml").read_text().replace("opsloop_lb_server_up == 0",
                                                                       "opsloop_lb_server_up == = 0", 1))
    r = run("promtool", "check", "rules", bad)
    assert r.returncode == 1 and "parse error" in (r.stdout + r.stderr)


def test_every_rule_is_covered_by_a_promtool_test() -> None:
    tested_alerts: set[str] = set()
    tested_exprs: list[str] = []
    loaded: set[str] = set()
    for f in TEST_FILES:
        doc = yaml.safe_load(f.read_text())
        loaded |= {str((f.parent / p).resolve()) for p in doc["rule_files"]}
        for t in doc["tests"]:
            tested_alerts |= {c["alertname"] for c in t.get("alert_rule_test", []) if c["exp_alerts"]}
            tested_exprs += [c["expr"] for c in t.get("promql_expr_test", [])]
    assert {str(p.resolve()) for p in RULE_FILES} <= loaded
    missing_alerts = {r["alert"] for r in alerting_rules()} - tested_alerts
    assert not missing_alerts, f"alerts never seen firing in a promtool test: {sorted(missing_alerts)}"
    missing_records = {r["record"] for r in rules() if "record" in r
                       if not any(r["record"] in e for e in tested_exprs)}
    assert not missing_records, f"recording rules without a promtool test: {sorted(missing_records)}"
    # Each severity variant of an alert fires in some test (exp_labels carry the severity).
    fired = set()
    for f in TEST_FILES:
        for t in yaml.safe_load(f.read_text())["tests"]:
            for c in t.get("alert_rule_test", []):
                fired |= {(c["alertname"], a["exp_labels"].get("severity")) for a in c["exp_alerts"]}
    assert {(r["alert"], r["labels"]["severity"]) for r in alerting_rules()} <= fired


def test_every_alert_says_what_where_observed_expected_and_links() -> None:
    """Conventional annotations; the links themselves are resolved in test_runbook_links.py."""
    for r in alerting_rules():
        name, ann, labels = r["alert"], r["annotations"], r["labels"]
        assert {"summary", "description", "runbook_url", "dashboard_url"} <= set(ann), name
        assert not {"runbook", "dashboard"} & set(ann), f"{name}: use runbook_url / dashboard_url"
        assert "Observed:" in ann["description"] and "Expected:" in ann["description"], name
        assert labels["severity"] in {"critical", "warning", "none"}, name
        assert "signal" in labels or '"signal"' in r["expr"], name
        assert ann["dashboard_url"].startswith(f"{DEFAULT_DASHBOARD_BASE_URL}/d/opsloop-"), name
        assert ann["runbook_url"].startswith(f"{DEFAULT_RUNBOOK_BASE_URL}/"), name
        assert ann["runbook_url"].endswith(f"#{alert_anchor(name)}"), name
        assert re.fullmatch(r"[A-Z][A-Za-z]+", name)


def test_keystone_alerts_honour_the_nightly_window() -> None:
    keystone = [r for r in alerting_rules() if r["labels"].get("signal") == "keystone"]
    assert keystone and all("opsloop:keystone_accounting_window:bool" in r["expr"] for r in keystone)


# -- Alertmanager ------------------------------------------------------------------------------
@pytest.mark.integration
def test_amtool_check_config() -> None:
    r = run("amtool", "check-config", ALERTS / "alertmanager.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 inhibit rules" in r.stdout and "4 receivers" in r.stdout and "1 templates" in r.stdout


@pytest.mark.integration
def test_amtool_rejects_a_broken_config(tmp_path: Path) -> None:
    bad = tmp_path / "am.yml"
    bad.write_text((ALERTS / "alertmanager.yml").read_text().replace("receiver: ticket", "receiver: tickets", 1))
    r = run("amtool", "check-config", bad)
    assert r.returncode != 0 and "tickets" in (r.stdout + r.stderr)


def test_no_secret_is_inline() -> None:
    doc = yaml.safe_load((ALERTS / "alertmanager.yml").read_text())
    text = yaml.safe_dump(doc)
    for key in ("routing_key:", "service_key:", "credentials:", "password:", "api_key:", "auth_token:"):
        assert key not in text, key
    pd = [c for r in doc["receivers"] for c in r.get("pagerduty_configs", [])]
    assert pd and all("routing_key_file" in c for c in pd)


@pytest.mark.parametrize("labels,receivers", [
    (["severity=critical", "signal=firewall", "alertname=FirewallUnprotectedPort"], "page"),
    (["severity=critical", "signal=edge", "alertname=OriginOverCapacity"], "page"),
    (["severity=warning", "signal=edge", "alertname=LbServerDown"], "ticket"),
    (["severity=warning", "signal=keystone", "alertname=KeystoneHeavyHitter"], "ticket"),
    (["severity=critical", "signal=keystone", "alertname=KeystoneDegraded"], "page"),
    (["severity=info", "signal=power", "alertname=PowerCost"], "blackhole"),
    (["severity=none", "signal=pipeline", "alertname=OpsloopWatchdog"], "heartbeat"),
])
@pytest.mark.integration
def test_routing_by_severity(labels: list[str], receivers: str) -> None:
    r = run("amtool", "config", "routes", "test", f"--config.file={ALERTS / 'alertmanager.yml'}", *labels)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == receivers


@pytest.mark.integration
def test_rendered_config_points_every_receiver_at_the_webhook(tmp_path: Path) -> None:
    key = tmp_path / "routing-key"
    key.write_text("test-routing-key\n")
    text = render_alertmanager_config(webhook_url="http://127.0.0.1:8099/", routing_key_file=key,
                                      timings={"group_wait": "1s", "group_interval": "2s"})
    doc = yaml.safe_load(text)
    hooks = {r["name"]: [h["url"] for h in r.get("webhook_configs", [])] for r in doc["receivers"]}
    assert hooks["page"] == ["http://127.0.0.1:8099/page"] and hooks["ticket"] == ["http://127.0.0.1:8099/ticket"]
    pd = doc["receivers"][[r["name"] for r in doc["receivers"]].index("page")]["pagerduty_configs"][0]
    assert pd["url"] == "http://127.0.0.1:8099/pagerduty" and pd["routing_key_file"] == str(key)
    assert doc["route"]["group_wait"] == "1s" and all(c["group_interval"] == "2s" for c in doc["route"]["routes"])
    assert "test-routing-key" not in text
    out = tmp_path / "am.yml"
    out.write_text(text)
    r = run("amtool", "check-config", out)
    assert r.returncode == 0, r.stdout + r.stderr


def test_render_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="webhook_url 'localhost:1'"):
        render_alertmanager_config(webhook_url="localhost:1", routing_key_file=tmp_path / "k")
    with pytest.raises(ValueError, match="group_wiat"):
        render_alertmanager_config(webhook_url="http://x", routing_key_file=tmp_path / "k",
                                   timings={"group_wiat": "1s"})
    with pytest.raises(ValueError, match="keystone-nightly-accounting"):
        render_alertmanager_config(webhook_url="http://x", routing_key_file=tmp_path / "k", time_intervals=[])


def test_silence_examples_are_well_formed() -> None:
    files = sorted((ALERTS / "silences").glob("*.json"))
    assert len(files) >= 3
    import json

    for f in files:
        s = json.loads(f.read_text())
        assert set(s) == {"matchers", "startsAt", "endsAt", "createdBy", "comment"}, f.name
        assert s["startsAt"] < s["endsAt"] and s["comment"] and s["matchers"]
        for m in s["matchers"]:
            assert set(m) == {"name", "value", "isRegex", "isEqual"}, f.name
            if m["isRegex"]:
                re.compile(m["value"])
