"""The real worker, Faust's recovery from the real ``detector-state`` changelog: a refused key's open finding is
cleared on the findings topic.

A worker runs over hypervisors with an open ``firewall.unprotected_port`` finding until their states are in the
changelog, is killed (SIGKILL), one state is damaged in the changelog and the worker started again.

Before (old code): a key refused at the restore (its report's time no time) forgot its open finding: no
``cleared`` was ever published for it (the page stayed open for good).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
from kafka import KafkaProducer

from opsloop.records import Finding
from opsloop.topics import Topic
from opsloop.streams.agents.stateful import STATE_TABLE
from tests.e2e.pipeline import start_worker
from tests.helpers import read_topic, scrape_metric, unique, wait_until
from tests.streams.agents.test_integration import committed_everything, detectors_config, findings_of, \
    iptables_round, produce, state_in_changelog

pytestmark = pytest.mark.integration

T0 = 1_795_310_400.0
PORT_FINDING = "firewall.unprotected_port"


class Run:
    """A worker's config, its hypervisors (each with an open port finding) and its changelog."""

    def __init__(self, stack: Any, tmp: Path, names: tuple[str, ...]) -> None:
        self.stack, self.tmp = stack, tmp
        self.bootstrap = stack.kafka_bootstrap
        self.config, self.doc = detectors_config(tmp, stack)
        self.app_id, self.port = self.doc["stream"]["app_id"], self.doc["stream"]["metrics_port"]
        self.changelog = f"{self.app_id}-{STATE_TABLE}-changelog"
        self.hvs = {name: unique(name) for name in names}
        self.t0 = min(T0, time.time() - 7200)   # never ahead of the worker's clock

    def round(self, name: str, i: int) -> tuple[Topic, str, bytes]:
        hv = self.hvs[name]
        return Topic.IPTABLES, hv, iptables_round(hv, self.t0 + 600 * i, {"p-open": False})

    def build_then_kill(self) -> None:
        worker = start_worker(self.tmp, self.config, self.doc, self.stack)
        try:
            produce(self.bootstrap, [self.round(n, 0) for n in self.hvs])
            for hv in self.hvs.values():
                key = f"firewall-detector|{hv}"
                wait_until(lambda key=key: (s := state_in_changelog(self.bootstrap, self.app_id, key))
                           and s["book"]["open"], timeout=90, what=f"state of {hv} in the changelog")
            # ... and the rounds' offsets committed: the state is in the changelog before the first commit (a 1 s
            # timer, its first tick 2 s after start), and a kill in between replayed round 0 after the restart,
            # which opened hv-a's refused key again before its round 1 (four findings where the test waits for
            # three: a CI run under load timed out so)
            wait_until(lambda: committed_everything(self.bootstrap, self.app_id, [Topic.IPTABLES]), timeout=60,
                       what="the rounds' offsets committed")
        finally:
            worker.kill()

    def changelog_records(self) -> dict[bytes, Any]:
        return {r.key: r for r in read_topic(self.bootstrap, self.changelog)}

    def table_key(self, name: str) -> bytes:
        return orjson.dumps(f"firewall-detector|{self.hvs[name]}")

    def write(self, records: list[tuple[bytes, bytes, int]]) -> None:
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        try:
            for key, value, partition in records:
                producer.send(self.changelog, key=key, value=value, partition=partition)
            producer.flush()
        finally:
            producer.close()

    @contextlib.contextmanager
    def restarted(self) -> Iterator[Any]:
        worker = start_worker(self.tmp, self.config, self.doc, self.stack)
        try:
            yield worker
        finally:
            worker.stop()

    def handled(self, name: str, i: int) -> None:
        hv = self.hvs[name]
        wait_until(lambda: scrape_metric(self.port, "opsloop_firewall_report_timestamp_seconds",
                                         {"hypervisor": hv}) == self.t0 + 600 * i,
                   timeout=90, what=f"round {i} of {hv} handled")

    def port_findings(self, name: str) -> list[tuple[str, Finding]]:
        return findings_of(self.bootstrap, PORT_FINDING, hypervisor=self.hvs[name])

    def unreadable(self, handler: str) -> float | None:
        return scrape_metric(self.port, "opsloop_stream_state_dropped_total",
                             {"handler": handler, "reason": "unreadable"})


def test_a_refused_keys_open_finding_is_cleared_on_the_findings_topic(stack: Any, tmp_path: Path) -> None:
    """hv-a's state refused (its report's time damaged, its book intact), hv-b's restored: a ``cleared`` of
    hv-a's port finding (same id and first_seen) is published at the restore; hv-a's next round, still
    unprotected, opens a new incident after it; hv-b's finding is neither cleared nor opened again."""
    run = Run(stack, tmp_path, ("hv-a", "hv-b"))
    run.build_then_kill()
    [(_, opened)] = run.port_findings("hv-a")
    record = run.changelog_records()[run.table_key("hv-a")]
    state = orjson.loads(record.value)
    state["report"]["timestamp"] = "yesterday"
    run.write([(record.key, orjson.dumps(state), record.partition)])

    with run.restarted() as worker:
        produce(run.bootstrap, [run.round("hv-b", 1)])   # the first batch restores: hv-a is refused
        events = wait_until(lambda: [(e, f) for e, f in run.port_findings("hv-a") if e == "cleared"],
                            timeout=90, what="the clear of hv-a's port finding")
        [(_, clear)] = events
        assert clear.id == opened.id and clear.cleared
        assert (clear.first_seen, clear.last_seen) == (opened.first_seen, opened.last_seen)
        assert "unreadable" in clear.explanation
        assert run.unreadable("firewall-detector") == 1.0
        produce(run.bootstrap, [run.round("hv-a", 1)])
        run.handled("hv-a", 1)
        seq = wait_until(lambda: (s := run.port_findings("hv-a")) and len(s) == 3 and s, timeout=90,
                         what="hv-a's port finding opened again")
        assert [e for e, _ in seq] == ["opened", "cleared", "opened"]
        assert seq[2][1].first_seen == run.t0 + 600 > opened.first_seen   # a new incident
        assert [e for e, _ in run.port_findings("hv-b")] == ["opened", "refreshed"]   # restored, still open
        log = worker.logfile.read_text()
        assert '"findings_cleared":1' in log.replace(" ", ""), "state_restore_failed names the findings cleared"
