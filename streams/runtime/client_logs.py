"""The Kafka client's own warnings and errors: counted each, logged once a minute per kind.

aiokafka logs every failed attempt of every retry loop: with the broker away the worker's consumer,
producer, fetcher and group coordinator each retry every ``retry_backoff_ms`` (100 ms), and a 40 s broker
restart wrote ~5,000 lines (~120 a second, most at error level: ``Unable connect to node with id 1``,
``Unable to update metadata from [1]``) to journald and the log pipeline, the few lines of the worker's own
in the middle of them (``tests/faults/test_broker_restart_pipeline.py``). When its metadata retry spins without
back-off (aio-libs/aiokafka#496: the fetcher forces an update that fails at once, again and again) the same
restart wrote 243,000 lines, ~6,000 a second. The spin itself is left as it is; the counter's rate shows it.

:class:`ClientLogLimiter` sits on every ``aiokafka`` logger: each warning or error is counted in
``opsloop_stream_kafka_client_warnings_total{logger,level}`` (the outage is a rate in /metrics), and a
line goes out for the first of its kind (logger, level, message template) and then at most once per
``every_s``, carrying ``fields.unlogged_since``: how many of that kind were left out since the last one
(as :class:`opsloop.log.Sampled` does for our own events). Lines below warning are left as they are.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from prometheus_client import Counter

from opsloop.log import Sampled

CLIENT_WARNINGS = Counter("opsloop_stream_kafka_client_warnings_total",
                          "Warnings and errors the worker's Kafka client (aiokafka) logged, each counted; "
                          "logged once a minute per kind", ["logger", "level"])
CLIENT_LOGGERS = "aiokafka"   # the logger and every logger under it


class ClientLogLimiter(logging.Filter):
    """A logger filter: see the module docstring. ``clock`` is injectable for tests."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        # one line per kind (logger, level, message template) and every_s, bounded as Sampled keeps its keys
        # (a library that formats its messages itself makes one kind per line)
        self._sampled = Sampled(every_s, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        CLIENT_WARNINGS.labels(record.name, record.levelname.lower()).inc()
        left_out = self._sampled.admit((record.name, record.levelno, str(record.msg)))
        if left_out is None:
            return False
        record.fields = {"unlogged_since": left_out}   # JsonFormatter writes a record's ``fields``
        return True


def limit_client_logs(every_s: float = 60.0) -> ClientLogLimiter:
    """Put one :class:`ClientLogLimiter` on the aiokafka loggers (each, once; a logger's filters see only its
    own records, not its children's). Call after aiokafka is imported: its modules create their loggers then."""
    limiter = ClientLogLimiter(every_s)
    names = [n for n in list(logging.Logger.manager.loggerDict)
             if n == CLIENT_LOGGERS or n.startswith(CLIENT_LOGGERS + ".")]
    for name in {CLIENT_LOGGERS, *names}:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, ClientLogLimiter)]:
            logger.removeFilter(old)   # a second app in one process (tests) replaces, never stacks
        logger.addFilter(limiter)
    return limiter
