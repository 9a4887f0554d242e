"""Structured JSON logs, one schema for every opsloop service: time, level, service, event, fields.

    log = get_logger("collector.haproxy")
    log.info("round_done", samples=12, errors=0)

Secrets never go to logs: callers pass no credentials, :func:`redact` masks keys that look secret, and
``user:password@`` in any URL of a line is masked (:mod:`opsloop.redact`).

The Kafka client libraries log each failed attempt of each retry loop: with the broker away kafka-python (every
service but the stream worker) wrote 3-5 lines a second per service, aiokafka (the worker) 120 to 6,000
(aio-libs/aiokafka#496), for the whole outage. :data:`KAFKA_CLIENT_LOGS`, on the handler :func:`setup_logging`
makes (and the worker's Faust logging config), counts each of their warnings and errors in
``opsloop_kafka_client_log_lines_total{logger,level}`` and lets a line through for the first of its kind and then
once a minute per kind, carrying ``fields.unlogged_since`` when some were left out (:class:`ClientLogLimiter`).
At ``--log-level debug`` the Kafka clients' own lines (debug, info) go out too (:func:`quiet_loggers`).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from typing import Any, Callable, Hashable

import orjson
from prometheus_client import Counter

from opsloop.redact import MASK, names_a_secret, redact_credentials

_service = "opsloop"


def redact(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: (MASK if names_a_secret(k) else v) for k, v in fields.items()}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": getattr(record, "service", _service),
            "logger": record.name,
            "event": record.event if hasattr(record, "event") else _message(record),
        }
        fields = getattr(record, "fields", None)
        if fields:
            doc["fields"] = redact(fields)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        try:
            text = orjson.dumps(doc, default=_shown).decode()
        except (orjson.JSONEncodeError, TypeError):   # an int beyond 64 bits, a non-str key: was a "Logging error"
            text = orjson.dumps(_plain(doc), default=_shown_text).decode()
        # Credentials in URLs (Alertmanager, Elasticsearch) never reach a log line, whoever logs them.
        return redact_credentials(text)


def _message(record: logging.LogRecord) -> str:
    """A library's own line (its ``msg % args``); arguments that do not fit the format (a library bug) give the
    template and the arguments as they are, not logging's "--- Logging error ---" traceback instead of the line."""
    try:
        return record.getMessage()
    except Exception as e:  # noqa: BLE001 - a bad format must not cost the log line
        return f"{_shown(record.msg)} (arguments not formatted: {type(e).__name__}: {_shown(record.args)[:200]})"


def _shown(value: Any) -> str:
    """What orjson cannot serialise (a set, bytes, any object) as its str(); never raises."""
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a failing __str__/__repr__ must not cost the log line
        return f"<{type(value).__name__} not printable>"


def _utf8(text: str) -> str:
    """``text`` with lone surrogates (bytes that were not UTF-8, read with ``surrogateescape``: a path, a BMC's
    output) as ``\\xNN`` escapes: orjson refuses them, and the whole line was lost to a "Logging error"."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:   # a surrogate surrogateescape did not make
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _shown_text(value: Any) -> str:
    return _utf8(_shown(value))


def _plain(value: Any) -> Any:
    """``value`` with what orjson refuses outright made text: ints beyond 64 bits, non-str keys, lone surrogates."""
    if isinstance(value, str):
        return _utf8(value)
    if isinstance(value, dict):
        return {_utf8(k) if isinstance(k, str) else _shown_text(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -2 ** 63 <= value < 2 ** 64:
        return str(value)
    return value


class EventLogger:
    """A thin adapter: ``log.info("event_name", key=value, ...)`` → one JSON line."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, exc_info: bool = False, **fields: Any) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"event": event, "fields": fields}, exc_info=exc_info)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, **fields)

    def error(self, event: str, exc_info: bool = False, **fields: Any) -> None:
        self._log(logging.ERROR, event, exc_info=exc_info, **fields)


def setup_logging(service: str, level: str = "info", stream: Any = None) -> None:
    """Send every logger (ours and the libraries') through the JSON formatter, to stderr by default; the Kafka
    clients' warnings and errors counted, one line a minute per kind (:data:`KAFKA_CLIENT_LOGS`)."""
    global _service
    _service = service
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # on the handler, not the loggers: it sees every client logger, those a later import creates too
    handler.addFilter(KAFKA_CLIENT_LOGS)
    for name, pinned in quiet_loggers(level).items():
        logging.getLogger(name).setLevel(pinned)


# Chatty clients: their INFO lines are connection churn, not events.
QUIET_LOGGERS = ("kafka", "aiokafka", "urllib3", "elastic_transport")


def quiet_loggers(level: str) -> dict[str, int]:
    """The level each chatty client logger is set to under ``level``: WARNING, but at debug the Kafka clients'
    own (NOTSET: the root's), which an operator debugging a broker problem needs; their warnings and errors
    stay counted and limited (:data:`KAFKA_CLIENT_LOGS`)."""
    debug = level.upper() == "DEBUG"
    return {n: logging.NOTSET if debug and n in KAFKA_CLIENT_LOGGERS else logging.WARNING for n in QUIET_LOGGERS}


class Sampled:
    """One line per ``every_s`` per key for an event that can repeat without bound (a poison
    stream's refused records): the first at once, then the next one due, naming how many were
    left out since (``unlogged_since``). The event's counter carries the rate; the log must not
    turn a flood of bad input into a flood of lines.

        REFUSED_LOG = Sampled(60.0)
        REFUSED_LOG.warning(log, "record_rejected", key=agent, reason=...)
    """

    MAX_KEYS = 1000   # keys may come from data: the table stays bounded

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] | None = None) -> None:
        self.every_s = every_s
        self.clock = clock   # None: time.monotonic, looked up at each call
        self._last: dict[Hashable, tuple[float, int]] = {}   # key -> (monotonic time logged, left out since)
        self._lock = threading.Lock()

    def warning(self, log: "EventLogger", event: str, key: str = "", **fields: Any) -> bool:
        """Log ``event`` unless a line for ``key`` went out within ``every_s``; True when logged."""
        return self._sampled(log.warning, event, key, fields)

    def error(self, log: "EventLogger", event: str, key: str = "", **fields: Any) -> bool:
        """As :meth:`warning`, at error level (something lost for good, each counted)."""
        return self._sampled(log.error, event, key, fields)

    def _sampled(self, emit: Callable[..., None], event: str, key: str, fields: dict[str, Any]) -> bool:
        left_out = self.admit(key)
        if left_out is None:
            return False
        if left_out:   # written only when lines were left out: ``unlogged_since: 0`` on every line said nothing
            fields = {"unlogged_since": left_out, **fields}
        emit(event, **fields)
        return True

    def admit(self, key: Hashable) -> int | None:
        """None when a line for ``key`` went out within ``every_s`` (this one is counted as left out); else
        how many were left out since the last line (the caller logs this one)."""
        now = self.clock() if self.clock is not None else time.monotonic()
        with self._lock:   # a producer's I/O thread logs beside the service's own
            last, left_out = self._last.get(key, (float("-inf"), 0))
            if now - last < self.every_s:
                self._last[key] = (last, left_out + 1)
                return None
            if len(self._last) >= self.MAX_KEYS and key not in self._last:
                self._last.clear()
            self._last[key] = (now, 0)
        return left_out


# kafka-python's loggers (kafka.net.manager, kafka.cluster, kafka.coordinator, ...) and aiokafka's
KAFKA_CLIENT_LOGGERS = ("kafka", "aiokafka")
KAFKA_CLIENT_LINES = Counter("opsloop_kafka_client_log_lines_total",
                             "Warnings and errors a Kafka client library (kafka-python, aiokafka) logged, each "
                             "counted; logged once a minute per kind", ["logger", "level"])
_NUMBERS = re.compile(r"[0-9]+")


class ClientLogLimiter(logging.Filter):
    """A handler filter for the Kafka client libraries' records (``loggers`` and every logger under them): each
    warning and error is counted in ``opsloop_kafka_client_log_lines_total{logger,level}``; the first of its kind
    (logger, level, message template) goes out at once, then one per ``every_s``, carrying ``fields.unlogged_since``
    (as :class:`Sampled` does for our own events). Lines below warning and other loggers' pass untouched.
    ``clock`` is injectable for tests."""

    KIND_CHARS = 200   # of the template: a kind's key stays small (Sampled keeps at most MAX_KEYS of them)

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] | None = None,
                 loggers: tuple[str, ...] = KAFKA_CLIENT_LOGGERS) -> None:
        super().__init__()
        self.loggers = loggers
        self._sampled = Sampled(every_s, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not any(
                record.name == n or record.name.startswith(n + ".") for n in self.loggers):
            return True
        KAFKA_CLIENT_LINES.labels(record.name, record.levelname.lower()).inc()
        # a message the library formats itself ("... (backoff 0.20 secs)", a port) is one kind whatever its numbers
        kind = _NUMBERS.sub("#", _shown(record.msg)[:self.KIND_CHARS])
        left_out = self._sampled.admit((record.name, record.levelno, kind))
        if left_out is None:
            return False
        if left_out:   # JsonFormatter writes a record's ``fields``; none when nothing was left out
            record.fields = {"unlogged_since": left_out}
        return True


# One per process: every handler that carries it (setup_logging's, the stream worker's) shares its minute.
KAFKA_CLIENT_LOGS = ClientLogLimiter()


def get_logger(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(f"opsloop.{name}"))
