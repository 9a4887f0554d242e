"""The paging actuator's Prometheus metrics (alerts/rules/pipeline.yml alerts on them)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

FINDINGS = Counter("opsloop_paging_findings_total", "Findings consumed, by resulting action", ["action"])
REJECTED = Counter("opsloop_paging_rejected_records_total", "Records on the findings topic that are not findings")
POSTS = Counter("opsloop_paging_posts_total", "Successful POST /api/v2/alerts batches")
SENT = Counter("opsloop_paging_alerts_sent_total",   # a rejected alert never; its fallback once accepted
               "Alerts Alertmanager accepted (a rejected one's fallback in its state)", ["state"])
DELIVERY_FAILURES = Counter("opsloop_paging_delivery_failures_total",
                            "POST attempts no Alertmanager accepted (retried with back-off)")
REPLACED = Counter("opsloop_paging_alerts_replaced_total",
                   "Alerts Alertmanager rejected as invalid, sent as an OpsloopPageRejected fallback instead")
DROPPED = Counter("opsloop_paging_alerts_dropped_total",   # once per page: its re-sends refused again do not count
                  "Pages lost: Alertmanager rejected the alert as invalid and its fallback too; once per page "
                  "until it is delivered or cleared, however often it is tried again")
RESOLVES_DROPPED = Counter("opsloop_paging_resolves_dropped_total",
                           "Queued resolves dropped over max_pending_resolves, by kind: best_effort (alert never "
                           "delivered from here), paged (an alert we sent; it ends at its endsAt instead)", ["kind"])
STATE_SAVE_FAILURES = Counter("opsloop_paging_state_save_failures_total",   # paging goes on, offsets held
                              "State file writes that failed (disk full, read-only): paging goes on, the offsets "
                              "are committed after the next save that succeeds")
COMMIT_FAILURES = Counter("opsloop_paging_commit_failures_total",
                          "Offset commits of the findings topic the broker did not take within the bound (retried)")
AUDIT_FAILURES = Counter("opsloop_paging_audit_failures_total", "Audit records that could not be written to Kafka")
ACTIVE = Gauge("opsloop_paging_active_alerts", "Open findings paged as firing alerts")
PENDING = Gauge("opsloop_paging_pending_alerts", "Alerts due for delivery but not delivered yet")
PAGES_LOST = Gauge("opsloop_paging_pages_lost",   # alerted while above 0: the counter's increase ends after 15m
                   "Open pages lost right now: Alertmanager refused the alert and its fallback at the last try "
                   "(tried again at the re-send interval) until delivered or cleared")
LAST_POLL = Gauge("opsloop_paging_last_poll_timestamp_seconds", "When the findings topic was last polled")
LAST_DELIVERY = Gauge("opsloop_paging_last_delivery_timestamp_seconds", "When Alertmanager last accepted alerts")
PAGE_LATENCY = Histogram("opsloop_paging_finding_to_page_seconds",
                         "From the finding's event time (last_seen) to its first delivery to Alertmanager",
                         buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300))
