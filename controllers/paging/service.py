"""The paging loop: poll findings, update the book, deliver what is due, persist, commit.

At-least-once: offsets are committed after the state that reflects them is saved, and the state is
saved before Alertmanager is posted what it holds; a replayed finding maps to the same alert (same
labels) and the book ignores records older than the newest of their id, so a replay never pages
twice. Alertmanager being down does not stop consumption: the book keeps the latest state per open
finding and a queue of resolves bounded by ``max_pending_resolves`` (beyond it the oldest are
dropped, best-effort ones first, counted in ``opsloop_paging_resolves_dropped_total``), and delivery
is retried with exponential back-off.

An alert Alertmanager rejects as invalid (400/422), or a proxy in front of it as too large alone (413), is never
dropped in silence: its fallback (``OpsloopPageRejected``, same severity and routing labels, the finding id, the
reason) is posted in its place at once and follows the finding (re-sent while it is open, resolved when it clears);
each rejection is logged (``alert_rejected``), audited (``page_rejected``) and counted: replaced
(``opsloop_paging_alerts_replaced_total``) or, the fallback rejected too, lost
(``opsloop_paging_alerts_dropped_total``). A lost page is tried again at the re-send interval; each refusal
is logged, the page is counted and audited lost once (until it is delivered or cleared), and a later try
that gets through is logged (``page_delivered_late``) and audited as delivered (``page_delivered``). The pages
lost right now are a gauge (``opsloop_paging_pages_lost``, set after every delivery step): it stays up while a
lost page is refused at its re-sends, after the counter's increase has ended.

A resolve Alertmanager took is re-sent at the re-send interval for ``resend_resolved_s`` (book docstring): one
restarted before it notified the resolve still does. A re-send it refuses is logged (``resolve_resend_rejected``)
and not sent again, never counted as a lost page: the resolve went through before.

A state file that cannot be written (disk full, read-only, a directory in its place) does not stop paging: each
failed save is logged (``state_save_failed``) and counted (``opsloop_paging_state_save_failures_total``), the
step delivers anyway and the offsets are not committed until a save succeeds (a crash replays them onto the last
saved book: alerts re-sent with the same labels, which Alertmanager dedupes). Before, the save raised before
delivery at every step: no page, re-send or resolve went out, the open alerts expired in Alertmanager at their
``endsAt`` (on-call told they resolved), and no alert fired (the loop still polled).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import orjson
from kafka import KafkaConsumer, TopicPartition

from opsloop.atomic_file import replace_file
from opsloop.config import KafkaSettings
from opsloop.records import Finding, Severity
from opsloop.kafka_admin import ensure_configured_topics
from opsloop.kafka_clients import (RecordHeaders, client_options, commit_bounded, connect_with_retry, kafka_settings,
                                   preflight_or_exit, send_deadletter, service_producer)
from opsloop.log import Sampled, get_logger
from opsloop.topics import Topic

from opsloop.controllers.paging import metrics
from opsloop.controllers.paging.alertmanager import AlertmanagerClient, AlertmanagerError, Backoff
from opsloop.controllers.paging.audit import Auditor
from opsloop.controllers.paging.book import Action, Late, OpenAlert, Outgoing, PagingBook, PendingResolve, SentResolve
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.mapping import FALLBACK_ALERTNAME, Links, iso

log = get_logger("paging")
REJECT_LOG = Sampled(60.0)   # a poison stream: one line a minute (the counter counts each)
DROP_LOG = Sampled(60.0)     # a long outage drops one resolve per clear: one line a minute per kind
SAVE_LOG = Sampled(60.0)     # a full disk fails every step's save: one line a minute (the counter counts each)
AHEAD_LOG = Sampled(60.0)    # a producer's clock far ahead stamps every clear: one line a minute

AUDIT_ACTIONS = {"open": "page_opened", "resolve": "page_resolved", "severity_changed": "page_severity_changed"}


class PagingService:
    def __init__(self, config: PagingConfig, kafka: KafkaSettings | str, *, client_id: str = "opsloop-paging",
                 consumer: Any = None, producer: Any = None, client: AlertmanagerClient | None = None) -> None:
        self.config = config
        self.kafka = kafka_settings(kafka)   # a bootstrap string means PLAINTEXT, no topic prefix
        self.topic = self.kafka.topic(config.topic)
        self.group_id = self.kafka.group(config.group_id)
        self.client_id = client_id
        self.book = PagingBook(min_severity=Severity(config.min_severity), resend_interval_s=config.resend_interval_s,
                               alert_ttl_s=config.alert_ttl_s,
                               links=Links(config.dashboard_base_url, config.runbook_base_url),
                               max_pending_resolves=config.max_pending_resolves, on_drop=self._resolve_dropped,
                               resend_resolved_s=config.resend_resolved_s)
        self.client = client or AlertmanagerClient(config.alertmanager_urls, config.request_timeout_s)
        self.backoff = Backoff(config.backoff_initial_s, config.backoff_max_s)
        self._consumer = consumer
        self._producer = producer
        self.auditor = Auditor(None, self.kafka.topic(config.audit_topic))
        self._caught_up = config.start_offset == "latest"
        self._catch_up_targets: dict[TopicPartition, int] | None = None
        self._dirty = False
        self._uncommitted = False   # records handled while the state could not be saved: committed after a save

    # -- wiring ---------------------------------------------------------------------------
    def _connect(self, create_topics: bool = False) -> None:
        """Build the clients not given; ``create_topics``: the missing topics too, once the producer reached a broker
        (its bootstrap waits for one; the admin client's would take 30 s to fail) and before the consumer asks."""
        if self._producer is None:
            self._producer = service_producer(self.kafka, self.client_id, linger_ms=5, max_block_ms=5000,
                                              request_timeout_ms=5000)
        if create_topics and self._consumer is None:
            self._ensure_topics()
        if self._consumer is None:
            self._consumer = KafkaConsumer(
                self.topic, group_id=self.group_id, **client_options(self.kafka),
                client_id=self.client_id, enable_auto_commit=False, auto_offset_reset=self.config.start_offset,
                max_poll_records=500,
                metadata_max_age_ms=10_000)  # see a topic created after we subscribed within seconds
        self.auditor.producer = self._producer

    def _ensure_topics(self) -> None:
        """Create the topics paging reads and writes if missing, with the configured partitions. Started before the
        stream workers (which create them), the consumer and the producer asked for topics that did not exist: each
        an error line from kafka-python ("Topic ... not found in cluster metadata"), a topic auto-created with the
        broker's defaults, and on brokers that do not auto-create, audit and dead-letter sends that block."""
        topics = [self.config.topic, self.config.audit_topic, Topic.DEADLETTER.value]
        ensure_configured_topics(self.kafka, log, topics)

    def load_state(self) -> None:
        path = self.config.state_file
        if not path.exists():
            return
        try:
            self.book.restore(orjson.loads(path.read_bytes()))
        except (OSError, ValueError, TypeError) as e:
            # A damaged state file costs a re-page at worst (findings are re-published): say so, go on.
            log.error("state_unreadable", path=str(path), error=str(e))
            return
        log.info("state_restored", path=str(path), open=len(self.book.open),
                 resolves=sum(len(q) for q in self.book.resolves.values()), resolved=len(self.book.resolved),
                 pages_lost=self.book.lost_pages())
        # at once: a restart waiting for Kafka would export 0 and restart OpsloopPagingPageStillLost's 15 min
        metrics.PAGES_LOST.set(self.book.lost_pages())

    def _resolve_dropped(self, r: PendingResolve) -> None:
        kind = "best_effort" if r.best_effort else "paged"
        metrics.RESOLVES_DROPPED.labels(kind).inc()
        self._dirty = True   # the saved queue must lose it too
        DROP_LOG.warning(log, "resolve_dropped", key=kind, kind=kind, finding_id=r.finding_id,
                         alertname=r.labels.get("alertname"), max_pending_resolves=self.config.max_pending_resolves)

    def save_state(self) -> None:
        path: Path = self.config.state_file
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, orjson.dumps(self.book.to_dict()))   # a crash leaves the old or the new, never half
        self._dirty = False

    def _try_save(self) -> bool:
        """Save the state if it changed; False when the file cannot be written (said and counted): paging goes on."""
        if not self._dirty:
            return True
        try:
            self.save_state()
        except OSError as e:
            metrics.STATE_SAVE_FAILURES.inc()
            SAVE_LOG.error(log, "state_save_failed", key="save", path=str(self.config.state_file),
                           error=str(e)[:500], open=len(self.book.open))
            return False
        return True

    # -- one step -------------------------------------------------------------------------
    def handle_records(self, values: list[bytes | None], now: float,
                       origins: list[tuple[int, int, bytes | None]] | None = None,
                       headers: list[RecordHeaders | None] | None = None) -> list[Action]:
        """Apply findings; ``origins`` are the records' (partition, offset, key), named in dead letters, and
        ``headers`` their headers (a replay refused again is marked so in its dead letter)."""
        actions: list[Action] = []
        changes = self.book.changes
        try:
            self._apply_records(values, now, actions, origins, headers)
        finally:
            if self.book.changes != changes:
                # every record that changed the book, ignored ones too (a cleared mark, a close): saved before
                # their offsets are committed, or a crash after the commit loses it and a late record re-pages
                self._dirty = True
        return actions

    def _apply_records(self, values: list[bytes | None], now: float, actions: list[Action],
                       origins: list[tuple[int, int, bytes | None]] | None,
                       headers: list[RecordHeaders | None] | None) -> None:
        for i, raw in enumerate(values):
            try:
                decoded = Finding.decode(raw)
                # stamped in the future: refused like a record that is no finding (but the open incident's clear)
                finding = self.book.check(decoded, now)
            except ValueError as e:
                metrics.REJECTED.inc()
                REJECT_LOG.warning(log, "finding_rejected", reason=str(e)[:300])
                self._deadletter(raw, str(e), origins[i] if origins else (None, None, None),
                                 headers[i] if headers else None)
                continue
            if finding is not decoded:
                AHEAD_LOG.warning(log, "finding_clock_ahead", finding_id=finding.id, detector=finding.detector[:200],
                                  ahead_s=round(max(decoded.first_seen, decoded.last_seen) - now, 3),
                                  action="the open incident's clear applied, last_seen clamped to now")
            try:
                applied = self.book.apply(finding, now)
            except Exception as e:  # noqa: BLE001 - one finding we cannot map must not stop the batch
                metrics.REJECTED.inc()
                reason = f"finding {finding.id} could not be paged: {type(e).__name__}: {e}"
                log.error("finding_failed", finding_id=finding.id, detector=finding.detector[:200],
                          reason=reason[:500], exc_info=True)
                self._deadletter(raw, reason, origins[i] if origins else (None, None, None),
                                 headers[i] if headers else None)
                continue
            for action in applied:
                actions.append(action)
                metrics.FINDINGS.labels(action.kind).inc()
                if action.kind in AUDIT_ACTIONS:
                    self.auditor.record(AUDIT_ACTIONS[action.kind], action.finding_id, action.labels, action.detail)

    def _deadletter(self, raw: bytes | None, reason: str, origin: tuple[int | None, int | None, bytes | None],
                    headers: RecordHeaders | None = None) -> None:
        """Keep what was not a finding for inspection (the stream stage's dead-letter topic and shape)."""
        if self._producer is not None:
            partition, offset, key = origin
            send_deadletter(self._producer, self.kafka, reason, source_topic=self.topic, partition=partition,
                            offset=offset, key=key, value=raw, stage="paging", log=log, headers=headers,
                            value_is="record")

    def deliver(self, now: float) -> int:
        """Post what is due (unless backing off); returns the number of alerts Alertmanager accepted. Until caught up
        with the findings (a new group's replay, a restart, Kafka away) only what Alertmanager held before: the
        alerts delivered and not expired there, the resolves of alerts delivered (the book's ``held_only``)."""
        if not self.backoff.ready(now):
            self._update_gauges(now)
            return 0
        held_only = not self._caught_up
        items = self.book.outgoing(now, held_only=held_only)
        if not items:
            self._update_gauges(now)
            return 0
        try:
            result = self.client.post([o.alert for o in items])
        except AlertmanagerError as e:
            delay = self._failed(e, now)
            metrics.DELIVERY_FAILURES.inc()
            log.warning("alertmanager_unreachable", error=str(e)[:500], alerts=len(items), retry_in_s=round(delay, 2))
            self._update_gauges(now)
            return 0
        self.backoff.succeeded()
        refused, accepted = _split(items, result.rejected)
        _count_sent(accepted)   # what Alertmanager took, now: a failed fallback post below does not undo it
        fallbacks, lost = self._replace_rejected(refused, now)
        replaced: list[Outgoing] = []
        if fallbacks:
            try:
                again = self.client.post([o.alert for o in fallbacks])
            except AlertmanagerError as e:
                # Nothing marked delivered: the next attempt sends the open alerts' fallbacks (the book holds
                # the mark) and the refused resolves again, refused and replaced again.
                delay = self._failed(e, now)
                metrics.DELIVERY_FAILURES.inc()
                log.warning("alertmanager_unreachable", error=str(e)[:500], alerts=len(fallbacks),
                            retry_in_s=round(delay, 2))
                self._update_gauges(now)
                return len(accepted)
            refused_too, replaced = _split(fallbacks, again.rejected)
            for o, reason in refused_too:
                self._lost(o, reason, now)
                lost.append(o.record)
            _count_sent(replaced)   # a fallback accepted: the page (or its resolve) went out
            accepted += replaced
        done = self.book.delivered(now, lost, replaced, held_only)   # a lost page is not audited as delivered
        metrics.POSTS.inc()
        metrics.LAST_DELIVERY.set(time.time())
        late = {id(x.alert): x for x in done.late}
        for a in done.first:
            latency = max(0.0, time.time() - a.event_time)
            metrics.PAGE_LATENCY.observe(latency)
            self.auditor.record("page_delivered", a.finding_id, a.labels,
                                f"delivered to Alertmanager {latency:.3f}s after the finding"
                                + (f" as {FALLBACK_ALERTNAME} (the alert was rejected)" if a.rejected else "")
                                + _late_note(late.get(id(a)), now))
        first = {id(a) for a in done.first}
        for x in done.late:
            self._delivered_late(x, now, audit=id(x.alert) not in first)
        self._dirty = True
        self._update_gauges(now)
        return len(accepted)

    def _failed(self, e: AlertmanagerError, now: float) -> float:
        """Back off after a post no Alertmanager took; the delay (its Retry-After if longer, up to the cap)."""
        delay = self.backoff.failed(now)
        if e.retry_after_s is not None:
            delay = self.backoff.at_least(now, e.retry_after_s)   # 429/503: asked to wait; retrying sooner adds load
        return delay

    def _replace_rejected(self, rejected: list[tuple[Outgoing, str]], now: float
                          ) -> tuple[list[Outgoing], list[OpenAlert | PendingResolve]]:
        """The fallbacks to post in place of the alerts Alertmanager rejected, each with the record of the alert
        it replaces; and the records of those lost (a rejected fallback: nothing replaces it)."""
        fallbacks: list[Outgoing] = []
        lost: list[OpenAlert | PendingResolve] = []
        for refused, reason in rejected:
            if isinstance(refused.record, SentResolve):
                # a re-send of a resolve Alertmanager took before: nothing is lost, it is not sent again
                self.book.forget_resolved(refused.record)
                self._dirty = True
                labels, fid = _who(refused.alert)
                log.warning("resolve_resend_rejected", alertname=labels.get("alertname"), finding_id=fid,
                            reason=reason)
                continue
            fallback = self.book.rejected(refused, reason, now)
            if fallback is None:
                self._lost(refused, reason, now)
                lost.append(refused.record)
                continue
            self._dirty = True   # an open alert refused is sent as its fallback from now on: the state says so
            fallbacks.append(Outgoing(fallback, refused.record))
            metrics.REPLACED.inc()
            labels, fid = _who(refused.alert)
            log.error("alert_rejected", alertname=labels.get("alertname"), finding_id=fid, reason=reason,
                      replaced_by=FALLBACK_ALERTNAME)
            self.auditor.record("page_rejected", fid, labels, f"Alertmanager rejected the alert ({reason}); "
                                f"{FALLBACK_ALERTNAME} sent in its place", result="sent")
        return fallbacks, lost

    def _lost(self, refused: Outgoing, reason: str, now: float) -> None:
        """A rejected alert nothing replaces (its fallback was rejected too): logged at every try; counted and
        audited once per page (:meth:`PagingBook.lost`), not at each re-send that is refused again."""
        counted = self.book.lost(refused, now)
        self._dirty = True   # the mark (since when, how many tries) is kept across a restart
        labels, fid = _who(refused.alert)
        record = refused.record
        since = record.lost_at if isinstance(record, OpenAlert) else None
        log.error("alert_rejected", alertname=labels.get("alertname"), finding_id=fid, reason=reason,
                  replaced_by=None, page_lost=True, counted=counted, resolve=refused.resolve,
                  lost_since=iso(since) if since is not None else None,
                  tries=record.lost_tries if isinstance(record, OpenAlert) else 1)
        if not counted:
            return
        metrics.DROPPED.inc()
        retry = "" if refused.resolve else f"; tried again every {self.config.resend_interval_s:g}s"
        self.auditor.record("page_rejected", fid, labels, f"Alertmanager rejected the alert ({reason}), "
                            f"{FALLBACK_ALERTNAME} fallback included: this page is lost{retry}", result="failed")

    def _delivered_late(self, late: Late, now: float, audit: bool) -> None:
        """A lost page Alertmanager took at a later try: said in the log, audited as delivered (``audit``: unless
        the first-delivery audit record said it already)."""
        a = late.alert
        labels, _ = a.outgoing()
        log.warning("page_delivered_late", finding_id=a.finding_id, alertname=labels.get("alertname"),
                    lost_since=iso(late.lost_at), lost_for_s=round(max(0.0, now - late.lost_at), 3),
                    refused_tries=late.tries)
        if audit:
            self.auditor.record("page_delivered", a.finding_id, a.labels, "delivered to Alertmanager again"
                                + (f" as {FALLBACK_ALERTNAME}" if a.rejected else "") + _late_note(late, now))

    def _update_gauges(self, now: float) -> None:
        metrics.ACTIVE.set(len(self.book.open))
        metrics.PENDING.set(self.book.pending(now))
        metrics.PAGES_LOST.set(self.book.lost_pages())

    def _check_caught_up(self) -> None:
        """Do not page while replaying history: wait until every assigned partition reaches its end."""
        consumer = self._consumer
        assigned = consumer.assignment()
        if not assigned:
            return
        if self._catch_up_targets is None or set(self._catch_up_targets) != assigned:
            self._catch_up_targets = consumer.end_offsets(list(assigned))
        if all(consumer.position(tp) >= end for tp, end in self._catch_up_targets.items()):
            self._caught_up = True
            log.info("caught_up", partitions=len(assigned), open=len(self.book.open))

    def step(self) -> None:
        now = time.time()
        if not self._caught_up:
            due_in = self.config.poll_timeout_s
        elif self.backoff.ready(now):
            due_in = self.book.next_due(now)
        else:
            due_in = self.backoff.wait(now)
        wait = min(self.config.poll_timeout_s, due_in)
        polled = self._consumer.poll(timeout_ms=max(10, int(wait * 1000)))
        metrics.LAST_POLL.set(time.time())
        records = [rec for recs in polled.values() for rec in recs]
        values = [rec.value for rec in records]
        now = time.time()
        if values:
            self.handle_records(values, now, [(rec.partition, rec.offset, rec.key) for rec in records],
                                [getattr(rec, "headers", None) for rec in records])
        if not self._caught_up:
            self._check_caught_up()
        # Saved before the post: a crash after it must not replay these records onto an older book (a stale
        # clear, a second page). A file we cannot write must not stop paging though: deliver anyway.
        self._try_save()
        self.deliver(now)
        self.auditor.flush(timeout_s=2.0)
        # the offsets only once the state holding their records is saved: a crash replays them, none is lost
        # bounded: re-sends, resolves and pages of the findings already read wait no longer with the broker away
        if self._try_save() and (values or self._uncommitted):
            self._uncommitted = not commit_bounded(
                self._consumer, log, metrics.COMMIT_FAILURES, "retried next step; a restart meanwhile replays the "
                "findings read since the last commit onto the saved state (no second page)")
        elif values:
            self._uncommitted = True

    def run(self, stop: threading.Event) -> None:
        own = self._consumer is None
        if own:
            preflight_or_exit(self.kafka, "paging", log)   # a wrong password or CA: exit now, say why
        # Loaded first, and what Alertmanager held kept up while the broker is away at start: before, nothing was
        # re-sent until Kafka answered and the open pages expired there (a false resolve, then a second page).
        self.load_state()

        def connect() -> None:
            self._keep_up()
            self._connect(create_topics=own)

        if not connect_with_retry(connect, stop, "paging", log, max_s=min(30.0, self.config.resend_interval_s)):
            self._try_save()
            self.close()
            return
        log.info("paging_started", topic=self.topic, group_id=self.group_id,
                 alertmanagers=self.config.alertmanager_urls, resend_interval_s=self.config.resend_interval_s)
        try:
            while not stop.is_set():
                try:
                    self.step()
                except Exception as e:  # noqa: BLE001 - a broker hiccup must not end paging
                    log.error("step_failed", error=str(e)[:500], exc_info=True)
                    stop.wait(1.0)
        finally:
            self._try_save()   # a file we cannot write is said and counted; the clients are closed all the same
            self.close()

    def _keep_up(self) -> None:
        """One delivery step without Kafka (waiting for a broker at start): re-sends and resolves owed, saved."""
        try:
            self.deliver(time.time())
            self._try_save()
        except Exception as e:  # noqa: BLE001 - the wait for Kafka goes on
            log.error("step_failed", error=str(e)[:500], exc_info=True)

    def close(self) -> None:
        for closer in (getattr(self._consumer, "close", None), getattr(self._producer, "close", None)):
            if closer is not None:
                try:
                    closer()
                except Exception:  # noqa: BLE001
                    pass
        self.client.close()


def _split(posted: list[Outgoing], rejected: list[tuple[dict[str, Any], str]]
           ) -> tuple[list[tuple[Outgoing, str]], list[Outgoing]]:
    """``posted`` as (refused, reason) and accepted, by the client's ``rejected``: the very alerts it was given."""
    reasons = {id(alert): reason for alert, reason in rejected}
    refused = [(o, reasons[id(o.alert)]) for o in posted if id(o.alert) in reasons]
    return refused, [o for o in posted if id(o.alert) not in reasons]


def _count_sent(accepted: list[Outgoing]) -> None:
    resolved = sum(1 for o in accepted if o.resolve)
    metrics.SENT.labels("resolved").inc(resolved)
    metrics.SENT.labels("firing").inc(len(accepted) - resolved)


def _late_note(late: Late | None, now: float) -> str:
    if late is None:
        return ""
    return (f", late: lost since {iso(late.lost_at)} ({max(0.0, now - late.lost_at):.0f}s, {late.tries} "
            f"post{'s' if late.tries != 1 else ''} of it and its fallback refused)")


def _who(alert: dict[str, Any]) -> tuple[dict[str, str], str]:
    """A posted alert's labels and finding id."""
    labels = alert.get("labels") or {}
    return labels, str((alert.get("annotations") or {}).get("finding_id") or labels.get("finding_id") or "")
