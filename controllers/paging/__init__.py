"""Paging actuator: findings from the streams become Alertmanager alerts (`opsloop page`).

Flow: ``findings`` topic (consumer group ``opsloop-paging``) -> :class:`~opsloop.controllers.paging.book.PagingBook`
(one alert per finding id, open / re-send / resolve) -> ``POST /api/v2/alerts`` on every configured
Alertmanager, with back-off while it is down -> one audit record (``audit`` topic + log line) per action.

Modules: ``config`` (the ``controllers.paging`` section), ``mapping`` (finding -> alert labels and
annotations), ``book`` (state by finding id), ``alertmanager`` (HTTP client, back-off), ``audit``,
``service`` (the loop), ``metrics``, ``amconfig`` (renders alerts/alertmanager.yml for other
receivers), ``cli`` (``main(argv)``).
"""

from opsloop.controllers.paging.config import PagingConfig

Config = PagingConfig

__all__ = ["Config", "PagingConfig"]
