"""The applier service: consume ``edge.weights``, apply this node's decisions with every safety rule.

One process per edge node (``opsloop weights run --edge ams1``), consumer group
``opsloop-actuator-<edge>``. Records are keyed ``<listener>|<edge>``; other edges' records are
skipped without decoding. Per (listener, edge) only the newest decision of a poll is applied.

* a failed apply (target unreachable) keeps the decision pending and retries it with exponential
  back-off; ``opsloop_actuator_errors_total{edge,kind}`` counts every failure; offsets are committed
  only when nothing is pending, so a restart re-reads what was not applied (replays are no-ops);
* an apply that ends in a read-back ``mismatch`` (audited by the applier) or an internal error (an
  exception out of the apply: a bug; audited ``failed``, ``errors_total{kind="internal"}``) keeps the
  decision pending too, retried with the same back-off (never hot), at most ``max_apply_attempts``
  times in a row: then it is given up -- audited ``failed`` ("gave up"), counted in
  ``opsloop_actuator_decisions_given_up_total{reason}``, an internal error's record dead-lettered --
  and the controller's re-sends of that version are skipped for ``stale_after_s`` (its next version
  applies as usual); a re-send after that gets a new budget (the cause may be gone: another writer,
  an LB state), so a version the controller keeps is retried once per ``stale_after_s``, never hot. A
  poison decision cannot wedge the slot, and none is committed as done while nothing handled it.
  Giving up applies nothing, so a controller stuck on it ends in fail static (no fresh decision); a
  decision given up after internal errors puts the slot in fail static at once (a bug that outlived its
  retries pages), an internal error before that does not (the retry a back-off later usually succeeds);
* drift: every ``reconcile_interval_s`` the LB is read and the last applied weights are put back if
  they differ (HAProxy restarted with its config weights), audited ``edge.weights.reconcile``;
* fail static: a decision older than ``stale_after_s``, none *applied or already live* for
  ``stale_after_s`` (refused decisions -- stale version, clock skew, all-zero, only DOWN origins --
  do not count as fresh), or a weight history that cannot be read or written holds the live
  weights, sets ``opsloop_edge_fail_static{listener,edge}`` to 1 and opens an ``edge.fail_static``
  finding; a decision applied (or found live) clears both. The state is kept next to the weight
  history (``<listener>.fail_static.json``): a restarted service still fails static, says the open
  finding once more (same incident) and clears it when fresh decisions return;
* findings go through an outbox (``outbox.py``): a send that raises or whose future fails is retried
  with back-off, in order per finding id, until the broker takes it. The state file says
  ``cleared`` until the clear is delivered, so a restart sends an undelivered clear again;
* refusals in a row are exported as ``opsloop_actuator_refused_decisions{edge,listener}`` (alert
  ``EdgeWeightActuatorRefusedInARow``): a controller restarted at a lower version without a new
  epoch, or one with a wrong clock, is visible at once instead of leaving old weights silently;
* two controller instances publishing at once (a failover left the old one up): the older epoch's decisions
  are refused (``stale_version``) or dropped for the newer one's in the same poll; not "in a row" (each
  re-send of the newer resets that count), so ``opsloop_actuator_fenced_writer{edge,listener}`` is 1 while
  they keep coming (one within ``stale_after_s``), logged ``fenced_writer`` / ``fenced_writer_gone``;
* a record keyed ``listener|edge`` of ours whose value names another listener or edge is rejected like a bad
  record (counted, dead-lettered): the actuator of the edge it names never decodes it (not its key);
* a decision whose ``epoch`` is more than ``max_clock_skew_s`` ahead of this host's clock is refused as it
  arrives (audited and counted by the applier, "in a row", dead-lettered): it never becomes the slot's pending
  decision, so the real controller's decisions of the same poll are not dropped for its higher stamp;
* a decision for a listener of ours with no target configured is counted
  (``opsloop_actuator_errors_total{kind="no_target"}``) and logged once a minute per listener;
* slots are isolated: an error in one listener's tick (a bug) is counted, logged and audited there
  (``failed``: of the decision it broke off, of the reconcile, or of the tick) and the other listeners
  go on. It does not fail static by itself: its decision is retried as above, a reconcile runs again
  next interval, and the staleness check the broken tick did not reach is made after it, so a slot
  whose every tick raises still fails static after ``stale_after_s``.

Clocks: the service's timers (freshness since the last applied decision, back-off, reconcile) are
elapsed times on ``time.monotonic()``, so a wall-clock step (NTP, a wrong RTC fixed by hand) neither
makes the slot fail static at once nor keeps it fresh for an hour; ``tick(now)`` takes a monotonic
time. Wall clock only where a time is a date: a decision's ``computed_at`` against the host's clock
(the applier: event time, written by another host) and a finding's first_seen/last_seen.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from opsloop.audit.trail import AuditLog
from opsloop.config import KafkaSettings
from opsloop.kafka_admin import ensure_configured_topics
from opsloop.records import Finding, Severity
from opsloop.kafka_clients import (RecordHeaders, client_options, commit_bounded, connect_with_retry, kafka_settings,
                                   preflight_or_exit, send_deadletter, service_producer)
from opsloop.log import Sampled, get_logger
from opsloop.topics import Topic

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.base import ApplyResult, Target
from opsloop.controllers.actuators.config import ActuatorConfig, HaproxyTargetConfig, LvsTargetConfig
from opsloop.controllers.actuators.haproxy import HaproxyTarget
from opsloop.controllers.actuators.lvs import LvsTarget
from opsloop.controllers.actuators.outbox import FindingOutbox
from opsloop.controllers.actuators.store import Stamp, StoreError, WeightStore
from opsloop.records import EdgeWeights

log = get_logger("actuator.service")
REJECT_LOG = Sampled(60.0)   # a poison stream: one line a minute (the counter counts each)
SKIP_LOG = Sampled(60.0)     # re-sends of a given-up version: one line a minute per slot
NO_TARGET_LOG = Sampled(60.0)   # decisions for a listener without a target: one line a minute per listener
# explanations of what a restarted service says again (its state file says it may not be delivered)
RESTATED_OPEN = "fail static since before this actuator started"
RESTATED_CLEAR = "fresh decisions came back before this actuator restarted"
FAIL_STATIC_DETECTOR = "edge.fail_static"
FAIL_STATIC_WHAT = "edge weights held (fail static)"
# Results that show the controller's decisions reach the LB: only these refresh freshness.
FRESH_RESULTS = frozenset({"applied", "noop", "dry_run", "shadow"})
REFUSALS = frozenset({"refused", "stale_version"})


def fail_static_finding_id(listener: str, edge: str) -> str:
    """The id of a slot's ``edge.fail_static`` finding (by detector and labels: one per slot)."""
    return Finding(detector=FAIL_STATIC_DETECTOR, what=FAIL_STATIC_WHAT, where={"listener": listener, "edge": edge},
                   first_seen=0.0, last_seen=0.0).id


def make_target(cfg: HaproxyTargetConfig | LvsTargetConfig) -> Target:
    if isinstance(cfg, HaproxyTargetConfig):
        return HaproxyTarget(cfg)
    return LvsTarget(cfg)


def make_actuator(config: ActuatorConfig, cfg: HaproxyTargetConfig | LvsTargetConfig, audit: AuditLog,
                  mode: str | None = None) -> EdgeActuator:
    target = make_target(cfg)
    # a stored weight above what the target takes is damage: reconcile and rollback could never write it; the
    # kind tags each entry, and sets aside those written to another kind of target before a switch (store.py)
    store = WeightStore(config.store_dir, cfg.edge, cfg.listener, config.history_max, target.max_weight, target.kind)
    return EdgeActuator(target, cfg.edge, cfg.listener, store, audit, mode=mode or config.mode,
                        max_step=config.max_step, stale_after_s=config.stale_after_s, weight_total=cfg.weight_total,
                        max_clock_skew_s=config.max_clock_skew_s)


@dataclass
class _Slot:
    actuator: EdgeActuator
    pending: EdgeWeights | None = None
    retry_at: float = 0.0                # monotonic
    delay_s: float = 0.0
    last_fresh: float = field(default_factory=time.monotonic)   # monotonic: elapsed since is the staleness
    fail_static_since: float | None = None   # wall clock: the finding's first_seen (a date)
    next_reconcile: float = 0.0          # monotonic
    refused_in_a_row: int = 0
    republish: bool = False              # fail static carried over from a previous run: say so once
    owed_clears: list[float] = field(default_factory=list)   # a previous run's clears (first_seen) maybe undelivered
    finding_id: str = ""                 # of this slot's edge.fail_static finding
    recorded: tuple[float, bool] | None = None   # (since, cleared) as the state file says (without ``owed``)
    # the pending decision's record (key, value, (partition, offset), headers): dead-lettered if it is given up
    pending_record: tuple[bytes | None, bytes | None, tuple[int | None, int | None], RecordHeaders | None] | None = None
    attempts: int = 0                    # applies of the pending decision ended by a mismatch or an internal error
    applying: bool = False               # inside the apply of ``pending`` (an exception then counts as an attempt)
    reconciling: bool = False            # inside a reconcile (an exception then is audited as its failure)
    given_up: Stamp | None = None        # the last decision given up: its re-sends are skipped until ...
    given_up_until: float = 0.0          # ... this (monotonic)
    fenced_at: float | None = None       # monotonic: last decision of an older epoch than one in force (2 writers)


class ActuatorService:
    def __init__(self, config: ActuatorConfig, kafka: KafkaSettings | str, edges: list[str], audit: AuditLog, *,
                 consumer: Any = None, producer: Any = None, client_id: str = "opsloop-actuator") -> None:
        unknown = sorted(set(edges) - set(config.edges))
        if not edges or unknown:
            raise ValueError(f"edges {unknown or edges!r}: no actuator targets configured for them "
                             f"(configured edges: {config.edges})")
        self.config = config
        self.kafka = kafka_settings(kafka)   # a bootstrap string means PLAINTEXT, no topic prefix
        self.edges = sorted(set(edges))
        self.audit = audit
        self.client_id = client_id
        self.group_id = self.kafka.group(f"{config.group_prefix}-{'+'.join(self.edges)}")
        self._consumer = consumer
        self._producer = producer
        self._uncommitted = False    # records handled since the last commit
        self._outbox = FindingOutbox(self._send_finding, self._finding_delivered,
                                     backoff_initial_s=config.backoff_initial_s, backoff_max_s=config.backoff_max_s)
        now = time.monotonic()
        self.slots: dict[tuple[str, str], _Slot] = {
            (t.listener, t.edge): _Slot(make_actuator(config, t, audit), last_fresh=now)
            for t in config.targets if t.edge in self.edges}
        for (listener, edge), slot in self.slots.items():
            # a previous run's open finding is ours to clear (else it stays open, paging, for good), and
            # so is a clear it could not deliver
            slot.finding_id = fail_static_finding_id(listener, edge)
            state = slot.actuator.store.fail_static_state()
            if state is not None and state.problem:   # logged by the store, naming the file and the field
                metrics.ERRORS.labels(edge, "store").inc()
            if state is not None:
                slot.owed_clears = state.owed + ([state.since] if state.cleared else [])
                slot.fail_static_since = None if state.cleared else state.since
                slot.recorded = (state.since, state.cleared)
            slot.republish = slot.fail_static_since is not None
            metrics.FAIL_STATIC.labels(listener, edge).set(1 if slot.republish else 0)
            metrics.REFUSED_IN_A_ROW.labels(edge, listener).set(0)
            metrics.FENCED_WRITER.labels(edge, listener).set(0)

    # -- wiring ----------------------------------------------------------------------------------
    def connect(self) -> None:
        from kafka import KafkaConsumer

        if self._consumer is None:
            self._consumer = KafkaConsumer(
                self.kafka.topic(self.config.topic), group_id=self.group_id, **client_options(self.kafka),
                client_id=self.client_id, enable_auto_commit=False, auto_offset_reset=self.config.start_offset,
                metadata_max_age_ms=10_000)
        if self._producer is None:
            self._producer = service_producer(self.kafka, self.client_id, linger_ms=5, max_block_ms=5000,
                                              request_timeout_ms=5000)
            # the topics it writes, once a broker answered (as the stream worker, paging, the collectors): on a broker
            # that does not auto-create, its first dead letter blocked max_block_ms and was lost, and its TopicGate
            # dropped the next minute's. Not allowed to create: said, and it goes on with what exists
            ensure_configured_topics(self.kafka, log, [Topic.DEADLETTER.value, self.config.findings_topic],
                                     retried="at the next start", service="actuator")

    # -- one step --------------------------------------------------------------------------------
    def handle_records(self, records: list[tuple[bytes | None, bytes | None]],
                       origins: list[tuple[int | None, int | None]] | None = None,
                       headers: list[RecordHeaders | None] | None = None) -> int:
        """Queue the newest decision per (listener, edge) of ours; returns how many were queued.
        A record of ours that is no valid decision is counted and dead-lettered (``origins``: each
        record's partition and offset, ``headers`` its headers -- a replay refused again says so --,
        for the dead letter)."""
        queued = 0
        now = time.monotonic()
        for i, (key, value) in enumerate(records):
            if key:
                _, _, key_edge = key.decode("utf-8", "replace").rpartition("|")
                if key_edge and key_edge not in self.edges:
                    continue  # another edge's decision: not ours to decode
            origin = origins[i] if origins else (None, None)
            hdrs = headers[i] if headers else None
            try:
                d = EdgeWeights.decode(value)
            except Exception as e:  # noqa: BLE001 - ValueError: no decision; else a decoder bug: the same bytes
                # fail the same way every time, so retrying cannot help: rejected like a bad record
                why = str(e) if isinstance(e, ValueError) else f"internal error decoding: {type(e).__name__}: {e}"
                metrics.REJECTED.inc()
                REJECT_LOG.warning(log, "decision_rejected", reason=why[:300])
                self._deadletter(key, value, why, origin, hdrs)
                continue
            if key and "|" in key.decode("utf-8", "replace"):
                key_listener, _, key_edge = key.decode("utf-8", "replace").rpartition("|")
                if (key_listener, key_edge) != (d.listener, d.edge):
                    # keyed for this edge, naming another: the other edge's actuator never decodes it (not its
                    # key), and which of the two is right nobody knows -- a controller bug, never applied
                    why = (f"record keyed {key_listener}|{key_edge} holds a decision for {d.listener}|{d.edge} "
                           f"(version {d.version}, epoch {d.epoch}): applied nowhere")
                    metrics.REJECTED.inc()
                    REJECT_LOG.warning(log, "decision_rejected", reason=why[:300])
                    self._deadletter(key, value, why, origin, hdrs)
                    continue
            if d.edge not in self.edges:
                continue
            slot = self.slots.get((d.listener, d.edge))
            if slot is None:   # a controller deciding for a listener nobody applies: its decisions go nowhere
                metrics.ERRORS.labels(d.edge, "no_target").inc()
                NO_TARGET_LOG.warning(log, "decision_without_target", key=f"{d.listener}|{d.edge}",
                                      listener=d.listener, edge=d.edge, version=d.version,
                                      configured=sorted(lst for lst, e in self.slots if e == d.edge))
                continue
            if self._refused_epoch_ahead(slot, d, (key, value, origin, hdrs)):
                continue   # before it can be pending: its stamp would win over the real controller's decisions
            if d.stamp == slot.given_up and now < slot.given_up_until:
                SKIP_LOG.warning(log, "decision_given_up_skipped", key=f"{d.listener}|{d.edge}", edge=d.edge,
                                 listener=d.listener, version=d.version, epoch=d.epoch)
                continue
            if slot.pending is not None and d.epoch != slot.pending.epoch:
                # two controller instances' decisions in one poll: the older epoch's is dropped unseen by the applier
                older, newer = sorted((d, slot.pending), key=lambda x: x.stamp)
                self._fenced(slot, older, newer.stamp, now)
            if slot.pending is None or d.stamp >= slot.pending.stamp:
                if slot.pending is None or d.stamp != slot.pending.stamp:
                    slot.attempts = 0   # a re-sent copy keeps its attempts (else a poison one never ends)
                slot.pending = d
                slot.pending_record = (key, value, origin, hdrs)
                queued += 1
        return queued

    def _refused_epoch_ahead(self, slot: _Slot, decision: EdgeWeights, record: tuple[
            bytes | None, bytes | None, tuple[int | None, int | None], RecordHeaders | None]) -> bool:
        """True when ``decision``'s epoch is too far ahead: refused by the applier (audited, counted), in a row,
        and dead-lettered. An audit or dead letter that raises (a bug) is logged: the poll's other records go on."""
        a = slot.actuator
        try:
            res = a.refuse_epoch_ahead(decision)
            if res is None:
                return False
            slot.refused_in_a_row += 1
            metrics.REFUSED_IN_A_ROW.labels(a.edge, a.listener).set(slot.refused_in_a_row)
            key, value, origin, headers = record
            self._deadletter(key, value, res.reason, origin, headers)
        except Exception as e:  # noqa: BLE001 - one record's handling must not lose the rest of the poll
            metrics.ERRORS.labels(a.edge, "internal").inc()
            log.error("decision_refusal_failed", edge=a.edge, listener=a.listener, version=decision.version,
                      epoch=decision.epoch, error=f"{type(e).__name__}: {e}"[:500], exc_info=True)
        return True

    def _deadletter(self, key: bytes | None, value: bytes | None, reason: str,
                    origin: tuple[int | None, int | None], headers: RecordHeaders | None = None) -> None:
        if self._producer is not None:
            send_deadletter(self._producer, self.kafka, reason, source_topic=self.kafka.topic(self.config.topic),
                            partition=origin[0], offset=origin[1], key=key, value=value, stage="actuator",
                            log=log, headers=headers, value_is="record")

    def tick(self, now: float) -> None:
        """Apply what is pending (when its back-off allows), then check for fail static, then send the
        findings that wait. One slot's error (counted, logged, audited) never stops the others; the
        decision it was applying stays pending (bounded retries). ``now`` is ``time.monotonic()``: every
        comparison here is of elapsed time."""
        for slot in self.slots.values():
            try:
                self._tick_slot(slot, now)
            except Exception as e:  # noqa: BLE001 - isolate the listeners of this edge
                self._slot_failed(slot, e, now)
        try:
            self._outbox.pump(now)
        except Exception as e:  # noqa: BLE001 - a bug here must not stop the applies (the findings wait)
            log.error("finding_outbox_failed", error=f"{type(e).__name__}: {e}"[:500], exc_info=True)

    def _slot_failed(self, slot: _Slot, error: Exception, now: float) -> None:
        """An exception out of a slot's tick (a bug): counted, logged, audited. If it broke off the apply of
        the pending decision, that is an attempt (retried, then given up: only then does the slot fail
        static). It does not fail static at once: the retry a back-off later usually succeeds, and a page
        opened and cleared within seconds for a one-off bug helps nobody (the errors metric and its alert
        say a bug that lasts). The staleness check the tick did not reach is made here, so a slot whose
        every tick raises still fails static after ``stale_after_s``."""
        a = slot.actuator
        text = f"internal error: {type(error).__name__}: {error}"[:500]
        metrics.ERRORS.labels(a.edge, "internal").inc()
        log.error("slot_failed", edge=a.edge, listener=a.listener, error=text, exc_info=True)   # (in its except)
        decision = slot.pending if slot.applying else None
        reconciling = slot.reconciling
        slot.applying = slot.reconciling = False
        steps: list[Callable[[], None]] = []
        if decision is not None:
            steps.append(lambda: self._apply_went_wrong(slot, decision, "internal", text, now))
        elif reconciling:   # tried again next reconcile_interval_s
            steps.append(lambda: a.fail(None, f"reconcile broken off by an {text}; tried again in "
                                              f"{self.config.reconcile_interval_s:g}s", text,
                                        action="edge.weights.reconcile"))
        else:   # outside any action on the LB (restating findings, the fail-static check): nothing to retry
            steps.append(lambda: a.fail(None, f"tick broken off by an {text}", text))
        steps.append(lambda: self._check_stale(slot, now, f"; the slot's tick failed: {text}"))
        for handle in steps:   # each on its own: an audit sink that raises must not keep the slot from failing static
            try:
                handle()
            except Exception as e:  # noqa: BLE001 - the handler of a bug may meet the same bug: the others go on
                log.error("slot_failure_not_handled", edge=a.edge, listener=a.listener,
                          error=f"{type(e).__name__}: {e}"[:500], exc_info=True)

    def _tick_slot(self, slot: _Slot, now: float) -> None:
        self._check_fenced(slot, now)
        self._queue_owed_clears(slot, now)
        if slot.republish:
            # the previous run may have died between recording the state and publishing the finding;
            # the same id and first_seen again is no new page
            slot.republish = False
            if slot.fail_static_since is not None:
                self._finding(slot, now, RESTATED_OPEN, cleared=False)
        if slot.pending is not None and now >= slot.retry_at:
            slot.applying = True
            res = slot.actuator.apply(slot.pending)
            self._after_apply(slot, res, now)
            slot.applying = False
        elif slot.pending is None and self.config.reconcile_interval_s and now >= slot.next_reconcile:
            slot.next_reconcile = now + self.config.reconcile_interval_s
            slot.reconciling = True
            slot.actuator.reconcile()
            slot.reconciling = False
        self._check_stale(slot, now)

    def _check_stale(self, slot: _Slot, now: float, cause: str = "") -> None:
        """Fail static when no decision was applied for ``stale_after_s`` (audited ``held``)."""
        if slot.fail_static_since is None and now - slot.last_fresh > self.config.stale_after_s:
            self._enter_fail_static(slot, now, f"no decision applied for {now - slot.last_fresh:.1f}s "
                                               f"> stale_after_s {self.config.stale_after_s}{cause}", audit=True)

    def _fenced(self, slot: _Slot, decision: EdgeWeights, over: Stamp | None, now: float) -> None:
        """``decision`` is refused or dropped for one of a newer epoch (``over``): another controller instance
        publishes for this slot (a failover left the old one up). Fenced, but said: its refusals are not "in a
        row" (the newer instance's re-sends reset that count every tick), so ``fenced_writer`` says it while
        such decisions keep coming (within ``stale_after_s``, more than a controller's interval)."""
        if over is None or decision.epoch >= over[0]:
            return   # an older version of the epoch in force: a replay, no second writer
        a = slot.actuator
        if slot.fenced_at is None:
            metrics.FENCED_WRITER.labels(a.edge, a.listener).set(1)
            log.warning("fenced_writer", edge=a.edge, listener=a.listener, epoch=decision.epoch,
                        version=decision.version, in_force_epoch=over[0], in_force_version=over[1],
                        reason="decisions of an older controller instance are still published next to the newer "
                               "one's: refused (fenced by epoch); stop the older instance")
        slot.fenced_at = now

    def _check_fenced(self, slot: _Slot, now: float) -> None:
        if slot.fenced_at is not None and now - slot.fenced_at > self.config.stale_after_s:
            slot.fenced_at = None
            metrics.FENCED_WRITER.labels(slot.actuator.edge, slot.actuator.listener).set(0)
            log.info("fenced_writer_gone", edge=slot.actuator.edge, listener=slot.actuator.listener,
                     quiet_s=self.config.stale_after_s)

    def _after_apply(self, slot: _Slot, res: ApplyResult, now: float) -> None:
        if res.retry:
            slot.delay_s = min(self.config.backoff_max_s, max(self.config.backoff_initial_s, slot.delay_s * 2))
            slot.retry_at = now + slot.delay_s
            log.warning("apply_retry", edge=slot.actuator.edge, listener=slot.actuator.listener,
                        retry_in_s=slot.delay_s, error=(res.error or "")[:300])
            return
        if res.result == "mismatch" and slot.pending is not None:
            # the LB holds weights nobody chose (another writer, a batch half taken): apply again, bounded
            self._apply_went_wrong(slot, slot.pending, "mismatch", res.reason, now)
            return
        decision = slot.pending
        self._drop_pending(slot)
        a = slot.actuator
        if res.result == "stale_version" and decision is not None:
            try:
                self._fenced(slot, decision, a.store.high_stamp(), now)
            except StoreError:   # the applier found it readable a moment ago; the next refusal says it
                pass
        if res.result in REFUSALS:
            slot.refused_in_a_row += 1
            metrics.REFUSED_IN_A_ROW.labels(a.edge, a.listener).set(slot.refused_in_a_row)
        if res.stale:
            self._enter_fail_static(slot, now, res.reason, audit=False)  # the apply audited "held" already
        elif res.result in FRESH_RESULTS:
            slot.last_fresh = now
            slot.refused_in_a_row = 0
            metrics.REFUSED_IN_A_ROW.labels(a.edge, a.listener).set(0)
            self._leave_fail_static(slot, now)

    def _apply_went_wrong(self, slot: _Slot, decision: EdgeWeights, why: str, text: str, now: float) -> None:
        """This apply of ``decision`` ended in a read-back mismatch or an internal error (``why``): retried
        after the back-off, given up after ``max_apply_attempts`` (audited failed, counted; the record of a
        poison decision dead-lettered). The state changes first: an audit that raises must not make it loop."""
        a = slot.actuator
        limit = self.config.max_apply_attempts
        slot.attempts += 1
        if slot.attempts < limit:
            slot.delay_s = min(self.config.backoff_max_s, max(self.config.backoff_initial_s, slot.delay_s * 2))
            slot.retry_at = now + slot.delay_s
            log.warning("apply_retry", edge=a.edge, listener=a.listener, version=decision.version, why=why,
                        attempt=slot.attempts, retry_in_s=slot.delay_s, error=text[:300])
            if why == "internal":   # a mismatch has its record from the applier
                a.fail(decision, f"{text}; attempt {slot.attempts} of {limit}, retried in {slot.delay_s:g}s", text)
            return
        record = slot.pending_record
        self._drop_pending(slot)
        # the controller re-sends its version every interval: a burst of attempts per re-send would be a
        # loop; one budget per stale_after_s (by then fail static has said nothing fresh reaches the LB)
        slot.given_up, slot.given_up_until = decision.stamp, now + self.config.stale_after_s
        metrics.GIVEN_UP.labels(a.edge, a.listener, why).inc()
        reason = (f"gave up after {limit} attempt(s) ended in {why} ({text[:300]}); version {decision.version} "
                  f"(epoch {decision.epoch}): its re-sends are skipped for {self.config.stale_after_s:g}s, the "
                  "controller's next version applies as usual")
        log.error("decision_given_up", edge=a.edge, listener=a.listener, version=decision.version,
                  epoch=decision.epoch, why=why, error=text[:300])
        if why == "internal":
            # a bug that outlived its retries: fail static (a page) now, not when staleness says so; the
            # failed record below says why (a mismatch -- another writer -- is left to staleness)
            self._enter_fail_static(slot, now, reason, audit=False)
            # kept for a post-mortem / replay once the bug is fixed
            key, value, origin, headers = record or (None, decision.encode(), (None, None), None)
            self._deadletter(key, value, reason, origin, headers)
        a.fail(decision, reason, text)

    @staticmethod
    def _drop_pending(slot: _Slot) -> None:
        slot.pending = None
        slot.pending_record = None
        slot.attempts = 0
        slot.delay_s = 0.0
        slot.retry_at = 0.0

    def _finding(self, slot: _Slot, now: float, reason: str, cleared: bool, first_seen: float | None = None) -> None:
        # a previous run's clears first, even when the tick's own restating raised: an older incident's clear
        # said after a newer open would resolve the newer page
        self._queue_owed_clears(slot, now)
        f = self._new_finding(slot, now, reason, cleared, first_seen)
        self._outbox.put(f, now)   # sent now if the broker takes it, else retried in order (outbox.py)

    def _queue_owed_clears(self, slot: _Slot, now: float) -> None:
        """The previous run left fail static but its clears may not have reached the broker (a clear delivered
        twice, or of an open never delivered, is harmless: a lost one pages for good). Each leaves
        ``owed_clears`` only once queued (from then on ``queued_clears`` owes it, in the state file too): one
        whose finding cannot be built or queued (a bug, raised: the tick is broken off) is tried again."""
        while slot.owed_clears:
            f = self._new_finding(slot, now, RESTATED_CLEAR, cleared=True, first_seen=slot.owed_clears[0])
            self._outbox.add(f)   # sent by this tick's pump, or a put of the slot's next finding before it
            slot.owed_clears.pop(0)

    def _new_finding(self, slot: _Slot, now: float, reason: str, cleared: bool,
                     first_seen: float | None = None) -> Finding:
        a = slot.actuator
        wall = time.time()   # dates of the finding; ``now`` (monotonic) only measures the time since fresh
        first = first_seen or slot.fail_static_since or wall
        return Finding(detector=FAIL_STATIC_DETECTOR, what=FAIL_STATIC_WHAT,
                       where={"listener": a.listener, "edge": a.edge}, observed=round(now - slot.last_fresh, 1),
                       expected=self.config.stale_after_s, severity=Severity.WARNING, explanation=reason[:1000],
                       first_seen=first, last_seen=wall, cleared=cleared,
                       runbook="edge-weights#fail-static")

    def _send_finding(self, f: Finding) -> Any:
        return self._producer.send(self.kafka.topic(self.config.findings_topic), key=f.id.encode(), value=f.encode())

    def _finding_delivered(self, f: Finding, left: int) -> None:
        """A clear reached the broker: the state file owes it no more (gone once nothing is owed). Kept exact:
        a clear said again after a restart while a newer incident is open would resolve that one's page."""
        slot = self.slots.get((f.where.get("listener", ""), f.where.get("edge", "")))
        if not f.cleared or slot is None or slot.recorded is None:
            return
        if not left and not slot.owed_clears and slot.fail_static_since is None:
            self._record_fail_static(slot, None)
        else:
            self._record_fail_static(slot, *slot.recorded)

    def _enter_fail_static(self, slot: _Slot, now: float, reason: str, audit: bool) -> None:
        if slot.fail_static_since is not None:
            return
        slot.fail_static_since = time.time()   # a date (the finding's first_seen), not a timer
        self._record_fail_static(slot, slot.fail_static_since)   # before the finding: a restart clears it
        metrics.FAIL_STATIC.labels(slot.actuator.listener, slot.actuator.edge).set(1)
        self._finding(slot, now, reason, cleared=False)   # before the audit: a sink that raises leaves no gauge alone
        if audit:
            slot.actuator.hold(reason)
        log.warning("fail_static", edge=slot.actuator.edge, listener=slot.actuator.listener, reason=reason)

    def _leave_fail_static(self, slot: _Slot, now: float) -> None:
        since = slot.fail_static_since
        if since is None:
            return
        slot.fail_static_since = None
        # kept (as cleared) until the clear reaches the broker: a restart before that sends it again
        self._record_fail_static(slot, since, cleared=True)
        metrics.FAIL_STATIC.labels(slot.actuator.listener, slot.actuator.edge).set(0)
        self._finding(slot, now, "fresh decisions are back", cleared=True, first_seen=since)
        log.info("fail_static_cleared", edge=slot.actuator.edge, listener=slot.actuator.listener)

    def _record_fail_static(self, slot: _Slot, since: float | None, cleared: bool = False) -> None:
        # earlier incidents' clears still waiting for the broker (or to be said again) are owed too: a
        # restart sends them first
        # (dict.fromkeys: one queued but not yet popped, the queuing having raised, is listed once)
        owed = list(dict.fromkeys(x for x in slot.owed_clears + self._outbox.queued_clears(slot.finding_id)
                                  if x != since)) if since is not None else []
        slot.recorded = (since, cleared) if since is not None else None
        try:
            slot.actuator.store.set_fail_static(since, cleared, owed)
        except StoreError as e:  # the finding still goes out; only a restart would not know of it
            metrics.ERRORS.labels(slot.actuator.edge, "store").inc()
            log.error("fail_static_state_not_recorded", edge=slot.actuator.edge, listener=slot.actuator.listener,
                      error=str(e)[:300])

    def step(self) -> None:
        now = time.monotonic()
        waits = [max(0.0, s.retry_at - now) for s in self.slots.values() if s.pending is not None]
        timeout = min([self.config.poll_timeout_s, *waits])
        polled = self._consumer.poll(timeout_ms=max(10, int(timeout * 1000)))
        metrics.LAST_POLL.set(time.time())
        polled_records = [r for recs in polled.values() for r in recs]
        records = [(r.key, r.value) for r in polled_records]
        if records:
            self.handle_records(records, [(r.partition, r.offset) for r in polled_records],
                                [getattr(r, "headers", None) for r in polled_records])
            self._uncommitted = True
        metrics.ASSIGNED.set(len(self._consumer.assignment()))   # after: polled records are never left unhandled
        self.tick(time.monotonic())
        # committed once nothing is pending, with or without new records (a retried decision done later too)
        if self._uncommitted and all(s.pending is None for s in self.slots.values()):
            # bounded: the ticks (reconcile, fail static, findings) wait no longer with the broker away
            if commit_bounded(self._consumer, log, metrics.COMMIT_FAILURES, "retried next step; a restart "
                              "meanwhile re-reads the decisions handled since the last commit (no-ops)"):
                self._uncommitted = False

    def run(self, stop: threading.Event) -> None:
        if self._consumer is None:
            preflight_or_exit(self.kafka, "actuator", log)   # a wrong password or CA: exit now, say why
        if not connect_with_retry(self.connect, stop, "actuator", log):   # broker away at start: wait
            self.close()
            return
        log.info("actuator_started", edges=self.edges, group_id=self.group_id, mode=self.config.mode,
                 targets=[s.actuator.target.describe() for s in self.slots.values()])
        try:
            while not stop.is_set():
                try:
                    self.step()
                except Exception as e:  # noqa: BLE001 - a broker hiccup must not end the actuator
                    log.error("step_failed", error=str(e)[:500], exc_info=True)
                    stop.wait(1.0)
        finally:
            self.close()

    def close(self) -> None:
        if self._producer is not None:
            # a last try for the findings that wait (the producer's close flushes it); the state file keeps the rest
            try:
                self._outbox.pump(float("inf"))
            except Exception:  # noqa: BLE001
                pass
        for closer in (getattr(self._consumer, "close", None), getattr(self._producer, "close", None),
                       self.audit.close):
            if closer is not None:
                try:
                    closer()
                except Exception:  # noqa: BLE001
                    pass
