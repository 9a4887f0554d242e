"""Every counter that counts something lost for good is alerted on, or says here why not.

A loss counter counts records, finding events, pages, decisions or audit records that are gone: nobody
will send, apply or store them. Nobody watches a counter on a dashboard at 3 am, so each one needs an alert
rule in alerts/rules/*.yml, or an entry in ``NOT_ALERTED`` below with the reason (the same reasons as
alerts/README.md, "Loss counters not alerted").

The counters are read from docs/metrics.md (every metric opsloop exports, checked against the code by
tests/e2e/test_metric_names.py): those whose name says dropped, lost or given up, plus ``OTHER_LOSSES``,
counters read in the code whose name does not say so. Counters of records *rejected* are not losses: what
they count is dead-lettered (kept on a dead-letter topic, alerted by OpsloopDeadLetterGrowing).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.helpers import REPO

METRICS_DOC = REPO / "docs" / "metrics.md"
ALERTS_README = REPO / "alerts" / "README.md"
RULE_FILES = sorted((REPO / "alerts" / "rules").glob("*.yml"))

LOSS_NAME = re.compile(r"dropped|lost|given_up")

# Losses whose names do not say so (what the code does with what they count).
OTHER_LOSSES = {
    # `unreadable`: a saved outbox torn or damaged at start, its events gone; `event`: a saved event skipped
    # (streams/agents/findings_sink.py); `write`: a save that failed, the events lost if the worker stops now
    "opsloop_findings_outbox_file_errors_total",
    # a record Kafka did not acknowledge is counted and logged, never sent again (opsloop/audit/kafka.py)
    "opsloop_audit_publish_failures_total",
    # the paging actuator's audit record not written to the topic, never retried (controllers/paging/audit.py)
    "opsloop_paging_audit_failures_total",
    # spool lines that do not decode, moved to the quarantine directory: never sent (opsloop/collect/spool.py)
    "opsloop_spool_quarantined_lines_total",
    # a refused record whose dead letter was not written (send raised, delivery failed): kept nowhere
    # (opsloop/kafka_clients.py, streams/runtime/batch.py)
    "opsloop_deadletter_send_failures_total",
}

# Counters whose loss is one label value: the alert must select it (the other values are no loss).
LOSS_SELECTORS = {
    # reason="cap": keys the handler still uses evicted, their state and open findings gone; reason="unreadable":
    # a key's stored state refused at a start (streams/detectors/state_check.py), the key starts afresh;
    # reason="ttl": keys silent for stream.state_ttl_s (a host retired), housekeeping (NOT_ALERTED's reasons);
    # reason="too_large": a state over one Kafka record, not written, lost at the next restart or rebalance
    "opsloop_stream_state_dropped_total": ('reason="cap"', 'reason="unreadable"', 'reason="too_large"'),
    # outcome="rejected": a document Elasticsearch refused (400), dropped (opsloop/audit/indexer.py)
    "opsloop_audit_records_total": ('outcome="rejected"',),
}

# Loss counters with no alert, on purpose. Keep the reasons in step with alerts/README.md.
NOT_ALERTED = {
    # A resolve is dropped only after max_pending_resolves (10,000) queued up, while Alertmanager is
    # unreachable (OpsloopPagingDeliveryFailing pages that) or a new consumer group replays the topic
    # (best_effort: alerts never delivered from here). Nothing stays open: every alert the actuator sent
    # carries endsAt (alert_ttl_s after its last re-send), and Alertmanager resolves it then by itself.
    "opsloop_paging_resolves_dropped_total":
        "Alertmanager resolves the alert at its own endsAt; the cause pages as OpsloopPagingDeliveryFailing",
    # TTL housekeeping in the edge controller: demand of a (backend, edge) not updated for ttl_s (an hour)
    # goes. The controller stopped using it long before (stale inputs: EdgeControllerFailStatic).
    "opsloop_edge_demand_dropped_total":
        "housekeeping: entries an hour old, of an LB or backend gone; stale inputs alert as fail static",
    # The lines were torn or damaged on disk (a crash or power cut mid-write): the crash itself is what
    # alerts (OpsloopTargetDown, OpsloopCollectorGone); the lines are kept in the quarantine directory and
    # logged (spool_lines_quarantined, spool_file_quarantined), one line each time.
    "opsloop_spool_quarantined_lines_total":
        "lines damaged on disk by a crash, kept in quarantine and logged; the crash alerts",
    # Replay-guard entries, not records: past 2,048 series of one Keystone host in the heavy-hitter window the
    # oldest entries go; every sample is still counted once, only a crash's replay of those may count twice.
    "opsloop_keystone_replay_guard_dropped_total":
        "guard entries, not records: nothing lost, a replay after a crash may count twice; logged",
}

_NAME_CHARS = r"[A-Za-z0-9_:]"


def documented_counters() -> dict[str, str]:
    """Counter name -> its labels column, from the exported-metrics tables of docs/metrics.md."""
    out: dict[str, str] = {}
    for line in METRICS_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1] == "counter" and re.fullmatch(r"`opsloop_[a-z0-9_]+`", cells[0]):
            out[cells[0].strip("`")] = cells[3]
    return out


def loss_counters() -> set[str]:
    return {n for n in documented_counters() if LOSS_NAME.search(n)} | OTHER_LOSSES


def alert_exprs(files: list[Path] = RULE_FILES) -> dict[str, list[str]]:
    """Alert name -> the exprs of its rules (an alert may have one rule per severity)."""
    out: dict[str, list[str]] = {}
    for f in files:
        for group in yaml.safe_load(f.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out.setdefault(rule["alert"], []).append(str(rule["expr"]))
    return out


def uses(expr: str, metric: str) -> bool:
    return re.search(rf"(?<!{_NAME_CHARS}){re.escape(metric)}(?!{_NAME_CHARS})", expr) is not None


def alerts_on(metric: str, files: list[Path] = RULE_FILES) -> list[str]:
    return sorted(name for name, exprs in alert_exprs(files).items() if any(uses(e, metric) for e in exprs))


def test_the_metrics_page_is_read() -> None:
    counters = documented_counters()
    assert len(counters) >= 60, "the tables of docs/metrics.md changed shape: update documented_counters()"
    found = loss_counters()
    assert {"opsloop_spool_dropped_records_total", "opsloop_collector_lost_records_total",
            "opsloop_paging_alerts_dropped_total", "opsloop_actuator_decisions_given_up_total"} <= found
    # the renamed-metrics table names an old counter too (the spool's, before its _total; spelt out nowhere
    # but there: tests/e2e/test_metric_names.py): only the exported ones count
    assert "opsloop_spool_dropped_records_total".removesuffix("_total") not in counters


def test_every_list_here_names_documented_counters() -> None:
    counters = documented_counters()
    for name in [*OTHER_LOSSES, *LOSS_SELECTORS, *NOT_ALERTED]:
        assert name in counters, f"{name} is not a counter of docs/metrics.md: renamed or gone? update the list"
    for name, selectors in LOSS_SELECTORS.items():
        for selector in selectors:
            label = selector.split("=")[0]
            assert label in counters[name], f"{name} has no label {label} in docs/metrics.md"


def test_every_loss_counter_is_alerted_or_says_why_not() -> None:
    missing = sorted(n for n in loss_counters() - set(NOT_ALERTED) if not alerts_on(n))
    assert not missing, (f"loss counters no alert rule reads: {missing}; add an alert to alerts/rules/pipeline.yml "
                         "(with a promtool test and a runbook section) or an entry with the reason in NOT_ALERTED")


def test_a_counter_left_out_is_not_alerted_after_all() -> None:
    """An entry of NOT_ALERTED must still be true: a counter alerted since has no business there."""
    stale = {n: alerts_on(n) for n in NOT_ALERTED if alerts_on(n)}
    assert not stale, f"alerted now, remove from NOT_ALERTED and alerts/README.md: {stale}"


def test_counters_lost_by_one_label_value_are_alerted_on_that_value() -> None:
    for name, selectors in LOSS_SELECTORS.items():
        for selector in selectors:
            pattern = re.compile(rf"(?<!{_NAME_CHARS}){re.escape(name)}\{{[^}}]*{re.escape(selector)}[^}}]*\}}")
            hits = [a for a, exprs in alert_exprs().items() if any(pattern.search(e) for e in exprs)]
            assert hits, f"no alert expr selects {name}{{{selector}}}"


def test_alerts_readme_gives_the_same_reasons() -> None:
    text = ALERTS_README.read_text()
    assert "## Loss counters not alerted" in text
    section = text.split("## Loss counters not alerted", 1)[1].split("\n## ", 1)[0]
    for name in NOT_ALERTED:
        assert f"`{name}`" in section, f"alerts/README.md does not say why {name} is not alerted"


def test_a_labelled_loss_counter_is_seen_from_its_first_loss() -> None:
    """prometheus_client creates a labelled child at its first ``inc()``: the series appears already at 1
    and ``increase()`` never sees that first step (a one-off loss, say an outbox unreadable at start, would
    never fire). So an alert on such a counter also fires on a series that was not there 15 min ago
    (``unless ... offset``). Unlabelled counters are exported at 0 from the start; the spool's dropped
    records are created at 0 by the publisher (opsloop/collect/publisher.py)."""
    created_at_zero = {"opsloop_spool_dropped_records_total"}
    counters = documented_counters()
    for name in sorted((loss_counters() | set(LOSS_SELECTORS)) - set(NOT_ALERTED) - created_at_zero):
        if counters[name] in {"—", "-", ""}:
            continue
        new_series = re.compile(rf"unless\s+{re.escape(name)}(\{{[^}}]*\}})?\s+offset\s")
        exprs = [e for a in alerts_on(name) for e in alert_exprs()[a] if uses(e, name)]
        assert any(new_series.search(e) for e in exprs), \
            f"{name}: no alert fires on a series born at its first loss (`{name} unless {name} offset 15m`)"
