"""Paging actuator: findings from the streams become Alertmanager alerts (`opsloop page`).

Flow: ``findings`` topic (consumer group ``opsloop-paging``) -> :class:`~opsloop.controllers.paging.book.PagingBook`
(one alert per finding id, open / re-send / resolve) -> ``POST /api/v2/alerts`` on every configured
Alertmanager, with back-off while it is down -> one audit record (``audit`` topic + log line) per action.

An alert Alertmanager rejects as invalid (HTTP 400 or 422) is never lost in silence. What the mapping can
prevent it does (valid label names, startsAt never after endsAt, a generatorURL only when Alertmanager
parses it); anything still rejected is replaced at once by a fallback alert ``OpsloopPageRejected`` (same
severity, routing and where-labels, cleaned; ``finding_id``, ``rejected_alertname``; annotations
``rejection_reason`` and the original links) that follows the finding: re-sent while it is open, resolved
when it clears, kept across restarts in the state file. Each rejection is logged (``alert_rejected``),
audited (``page_rejected``) and counted (``opsloop_paging_alerts_replaced_total``, or
``opsloop_paging_alerts_dropped_total`` when the fallback is rejected too and the page is lost).

Modules: ``config`` (the ``controllers.paging`` section), ``mapping`` (finding -> alert labels and
annotations), ``book`` (state by finding id), ``alertmanager`` (HTTP client, back-off), ``audit``,
``service`` (the loop), ``metrics``, ``amconfig`` (renders alerts/alertmanager.yml for other
receivers), ``cli`` (``main(argv)``).
"""

from opsloop.controllers.paging.config import PagingConfig

Config = PagingConfig

__all__ = ["Config", "PagingConfig"]
