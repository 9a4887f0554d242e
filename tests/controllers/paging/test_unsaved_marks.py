"""Paging's bookkeeping of closed incidents, and a clear from a producer whose clock runs far ahead.

* Records the book ignores can still change it: the late clear of an incident older than the open one marks
  that incident cleared; a below-threshold clear of a finding not open closes it and marks it cleared. Before,
  only the actions that post (open, refresh, resolve, severity change) marked the state for saving: those
  offsets were committed with the marks unsaved, and a crash before the next save lost them; after the
  restart a late record of the closed incident paged it again.
* A clear stamped more than 300 s ahead was refused and dead-lettered: a page opened from a worker with a good
  clock stuck open when another worker's clear came from a clock that far ahead. The clear of the open
  incident (its id and ``first_seen``) now applies, ``last_seen`` clamped to now; anything else so far ahead is
  still refused, counted and dead-lettered.

Real Kafka and the real Alertmanager of the tests; each test its own topic prefix and group; the process
"dies" by being dropped without a save (what a SIGKILL leaves: the state file of the last save, the offsets of
the last commit).
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from opsloop.config import KafkaSettings
from opsloop.log import Sampled
from opsloop.controllers.paging import metrics, service as paging_service
from opsloop.controllers.paging.book import PagingBook
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from opsloop.records import Finding, Severity
from opsloop.stack import ManagedProcess
from opsloop.topics import Topic
from tests.alerting import am_url
from tests.controllers.paging.test_state_and_audit_failures import committed, firing, publish
from tests.helpers import captured_logs, create_topics, read_topic, unique, wait_until

pytestmark = pytest.mark.integration

CRIT, WARN, INFO = Severity.CRITICAL, Severity.WARNING, Severity.INFO


def rec(hv: str, first_seen: float, last_seen: float, cleared: bool = False, severity: Severity = CRIT) -> Finding:
    return Finding(detector="firewall.unprotected_port", what="VM port without its security-group chain",
                   where={"hypervisor": hv, "vm": "web-1"}, severity=severity, first_seen=first_seen,
                   last_seen=last_seen, cleared=cleared)


class Paging:
    """One paging process, stepped by hand: built from the state file and the group's committed offset."""

    def __init__(self, cfg: PagingConfig, kafka: KafkaSettings) -> None:
        self.cfg, self.kafka = cfg, kafka
        self.svc = PagingService(cfg, kafka)
        self.svc.load_state()
        self.svc._connect()

    def through(self, offset: int) -> None:
        """Step until the records before ``offset`` are committed."""
        group, topic = self.kafka.group(self.cfg.group_id), self.kafka.topic(Topic.FINDINGS)
        wait_until(lambda: (self.svc.step(), committed(self.kafka.bootstrap_servers, group, topic) >= offset)[1],
                   timeout=60, what=f"the findings before offset {offset} committed")

    def die(self) -> None:
        self.svc.close()   # no save: what a crash leaves


def setup(tmp_path: Path, bootstrap: str, am: ManagedProcess, name: str) -> tuple[PagingConfig, KafkaSettings]:
    kafka = KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=unique(name) + ".")
    create_topics(bootstrap, kafka.topic(Topic.FINDINGS), kafka.topic(Topic.AUDIT), kafka.topic(Topic.DEADLETTER))
    # re-sends an hour apart: no delivery in the steps below saves the state by the way
    cfg = PagingConfig(state_file=tmp_path / "state.json", alertmanager_urls=[am_url(am)], group_id=unique(name),
                       resend_interval_s=3600, poll_timeout_s=0.2)
    return cfg, kafka


# (records before the crash, each committed in its own step; records after the restart), times from now
SCENARIOS = {
    # incident A paged; B started on the new owner (a refresh); A's clear arrives late: B's page stays. After the
    # restart B clears, then A's old owner's record stamped after B's clear comes: A is over, not a new page.
    "older_incident_clear": (
        [(-100, -100, False, CRIT), (-50, -50, False, CRIT), (-100, -90, True, CRIT)],
        [(-50, -40, True, CRIT), (-100, -30, False, CRIT)]),
    # paged as a warning, dropped to info (resolved), cleared at info (not open: only marked); a stale warning
    # record of that incident stamped before the clear comes after the restart
    "below_threshold_clear": (
        [(-100, -100, False, WARN), (-100, -80, False, INFO), (-100, -60, True, INFO)],
        [(-100, -70, False, WARN)]),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_an_ignored_records_marks_survive_a_crash_after_their_commit(scenario: str, tmp_path: Path,
                                                                     kafka_bootstrap: str,
                                                                     test_alertmanager: ManagedProcess) -> None:
    cfg, kafka = setup(tmp_path, kafka_bootstrap, test_alertmanager, "unsavedmarks")
    topic, run, t = kafka.topic(Topic.FINDINGS), unique("hv"), time.time()
    hv = f"{run}-1"
    before, after = SCENARIOS[scenario]
    paging = Paging(cfg, kafka)
    for n, (first, last, cleared, sev) in enumerate(before, 1):
        publish(kafka_bootstrap, topic, rec(hv, t + first, t + last, cleared, sev))
        paging.through(n)
    assert paging.svc.book.cleared.get(rec(hv, t, t).id), "the clear was not marked"
    paging.die()   # after the commit of the last record, before any other save

    paging = Paging(cfg, kafka)
    try:
        for n, (first, last, cleared, sev) in enumerate(after, len(before) + 1):
            publish(kafka_bootstrap, topic, rec(hv, t + first, t + last, cleared, sev))
            paging.through(n)
        assert paging.svc.book.open == {}, "a late record of an incident already closed re-opened its page"
        paging.svc.step()
        assert firing(test_alertmanager, run) == set()
    finally:
        paging.die()


def test_the_open_incidents_clear_from_a_clock_far_ahead_resolves_its_page(tmp_path: Path, kafka_bootstrap: str,
                                                                           test_alertmanager: ManagedProcess,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paging_service, "AHEAD_LOG", Sampled(60.0), raising=False)   # its first line, whatever ran
    cfg, kafka = setup(tmp_path, kafka_bootstrap, test_alertmanager, "clearahead")
    topic, deadletter, run, t = kafka.topic(Topic.FINDINGS), kafka.topic(Topic.DEADLETTER), unique("hv"), time.time()
    hv = f"{run}-1"
    opened = rec(hv, t, t)
    paging = Paging(cfg, kafka)
    try:
        publish(kafka_bootstrap, topic, opened)
        paging.through(1)
        wait_until(lambda: (paging.svc.step(), firing(test_alertmanager, run) == {hv})[1], timeout=30,
                   what="the page delivered")
        rejected = metrics.REJECTED._value.get()
        # far ahead and not the open incident's clear: an older incident's clear, the open incident's firing record
        publish(kafka_bootstrap, topic, rec(hv, t - 600, t + 3600, cleared=True), rec(hv, t, t + 3600))
        paging.through(3)
        assert metrics.REJECTED._value.get() - rejected == 2
        assert firing(test_alertmanager, run) == {hv}
        with captured_logs() as logs:
            publish(kafka_bootstrap, topic, rec(hv, t, t + 3600, cleared=True))   # the open incident's own clear
            paging.through(4)
        assert metrics.REJECTED._value.get() - rejected == 2
        assert paging.svc.book.open == {}
        first_seen, last_seen, cleared = paging.svc.book.closed[opened.id]
        assert (first_seen, cleared) == (t, True) and last_seen <= time.time()   # clamped: hides no later record
        wait_until(lambda: (paging.svc.step(), firing(test_alertmanager, run) == set())[1], timeout=30,
                   what="the page resolved")
        assert any(ln.startswith("finding_clock_ahead") and opened.id in ln for ln in logs.lines)
        letters = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, deadletter)]
        assert [d["offset"] for d in letters] == [1, 2] and all("in the future" in d["reason"] for d in letters)
    finally:
        paging.die()


def test_only_the_open_incidents_clear_is_taken_from_the_future_and_clamped() -> None:
    now = 1_795_310_400.0
    b = PagingBook()
    b.apply(rec("h", now, now), now)
    far = now + 3600
    for refused in (rec("h", now, far), rec("h", now - 60, far, cleared=True), rec("h", far, far, cleared=True),
                    rec("other", now, far, cleared=True)):
        with pytest.raises(ValueError, match="in the future"):
            b.check(refused, now)
    taken = b.check(rec("h", now, far, cleared=True), now + 5)
    assert (taken.first_seen, taken.last_seen, taken.cleared) == (now, now + 5, True)
    assert [a.kind for a in b.apply(rec("h", now, far, cleared=True), now + 5)] == ["resolve"]
    assert b.closed[taken.id] == (now, now + 5, True)
    # the next incident, stamped by a clock stepped back before the clear: pages once past the clear's clamped stamp
    assert [a.kind for a in b.apply(rec("h", now - 10, now + 10), now + 10)] == ["open"]
    with pytest.raises(ValueError, match="in the future"):   # cleared and no longer open: refused again
        b.check(rec("h", now, far, cleared=True), now + 10)
