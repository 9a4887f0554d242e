"""The Keystone load collector: one round = probes + uWSGI stats + new log lines since last round."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Callable, TypeVar

from opsloop.collect.types import CollectError, CollectorUnavailable, Round
from opsloop.records import Metric, metric

from . import aggregate, nginx_log, uwsgi_log, uwsgi_stats
from .config import Config
from .credentials import CredentialsError, ProbeCredentials, load
from .latency import summarize
from .probe import KeystoneProber
from .tail import LogTail, TailResult

log = logging.getLogger(__name__)
R = TypeVar("R")

# Query strings can carry presigned-URL signatures: never quote them into an error record.
_QUERY = re.compile(r"\?[^\s\"]*")


def redact(line: str, limit: int = 160) -> str:
    line = _QUERY.sub("?<redacted>", line)
    return line[:limit] + ("..." if len(line) > limit else "")


class _LogSource:
    """One tailed log plus the time of its previous read (for rates)."""

    def __init__(self, path: Path, config: Config, metric_name: str) -> None:
        self.tail = LogTail(path, start_at=config.start_at, max_bytes=config.max_read_bytes)
        self.metric_name = metric_name
        self.last_read = time.monotonic()

    def read(self) -> tuple[TailResult, float]:
        result = self.tail.read_lines()
        now = time.monotonic()
        window, self.last_read = now - self.last_read, now
        return result, window


class KeystoneCollector:
    name = "keystone"

    def __init__(self, config: Config) -> None:
        self.config = config
        self._credentials_error: str | None = None
        self.prober: KeystoneProber | None = None
        if config.probes.enabled:
            try:
                creds: ProbeCredentials = load(config.probes.credentials_file, config.probes.env_prefix)
                self.prober = KeystoneProber(config.url, creds, config.probes.timeout_s, config.probes.samples,
                                             config.probes.s3_region)
            except CredentialsError as e:
                self._credentials_error = str(e)
        self._uwsgi_log = _LogSource(config.uwsgi_access_log, config, "keystone_logfile") if config.uwsgi_access_log else None
        self._frontend_logs = [_LogSource(p, config, "s3_frontend_logfile") for p in config.frontend.access_logs]

    def close(self) -> None:
        if self.prober:
            self.prober.close()
        for src in ([self._uwsgi_log] if self._uwsgi_log else []) + self._frontend_logs:
            src.tail.close()

    def collect(self) -> Round:
        cfg = self.config
        only_probes = not (cfg.uwsgi_stats or cfg.uwsgi_access_log or cfg.frontend.access_logs)
        if self._credentials_error and only_probes:
            raise CollectorUnavailable(f"{self._credentials_error}; set probes.credentials_file or the "
                                       f"{cfg.probes.env_prefix}* environment variables")
        now = time.time()
        deadline = time.monotonic() + cfg.round_timeout_s
        out = Round()
        if self._credentials_error:
            out.errors.append(CollectError("probe-credentials", "auth", self._credentials_error))
        if self.prober:
            self._probe(out, now, deadline)
        if cfg.uwsgi_stats:
            self._stats(out, now, deadline)
        if self._uwsgi_log:
            self._read_log(out, self._uwsgi_log, uwsgi_log.parse_line, now,
                           lambda recs, window: aggregate.keystone_requests(
                               recs, cfg.host, window, cfg.max_endpoints, now))
        if self._frontend_logs:
            records: list[nginx_log.FrontendRecord] = []
            windows = []
            for src in self._frontend_logs:
                def keep(recs: list[nginx_log.FrontendRecord], window: float) -> list[Metric]:
                    records.extend(recs)
                    windows.append(window)
                    return []
                self._read_log(out, src, nginx_log.parse_line, now, keep)
            fe = cfg.frontend
            out.metrics.extend(aggregate.frontend_metrics(
                records, cfg.host, frozenset(fe.local_access_keys), fe.top_credentials, fe.small_request_bytes,
                max(windows), now))
        return out

    # --- parts of a round ----------------------------------------------------------------------
    def _probe(self, out: Round, now: float, deadline: float) -> None:
        assert self.prober is not None
        results, errors = self.prober.run(deadline)
        out.errors.extend(errors)
        for r in results:
            tags = {"host": self.config.host, "probe": r.probe}
            fields: dict[str, float] = {"count": 0.0, **summarize(r.latencies_ms), "errors": float(r.errors)}
            out.metrics.append(metric("keystone_probe", fields, tags, now))
            for status, n in sorted(r.statuses.items()):
                out.metrics.append(metric("keystone_probe_errors", {"count": float(n)}, {**tags, "status": status},
                                          now))

    def _stats(self, out: Round, now: float, deadline: float) -> None:
        address = self.config.uwsgi_stats
        assert address is not None
        try:
            stats = uwsgi_stats.parse(uwsgi_stats.fetch(address, max(0.5, min(5.0, deadline - time.monotonic()))))
        except uwsgi_stats.StatsError as e:
            out.errors.append(CollectError(address, e.kind, str(e)))
            return
        host = self.config.host
        out.metrics.append(metric("uwsgi_server", {
            "listen_queue": float(stats.listen_queue),
            "listen_queue_errors": float(stats.listen_queue_errors),
            "workers": float(len(stats.workers)),
            "busy_workers": float(stats.busy_workers),
            "requests": float(sum(w.requests for w in stats.workers)),
            "exceptions": float(sum(w.exceptions for w in stats.workers)),
        }, {"host": host}, now))
        for w in stats.workers:
            out.metrics.append(metric("uwsgi_worker", {
                "requests": float(w.requests), "exceptions": float(w.exceptions),
                "harakiri_count": float(w.harakiri_count), "avg_rt_ms": w.avg_rt_ms,
                "respawn_count": float(w.respawn_count), "busy": w.status == "busy",
            }, {"host": host, "worker": str(w.worker_id)}, now))

    def _read_log(self, out: Round, src: _LogSource, parse: Callable[[str], R], now: float,
                  emit: Callable[[list[R], float], list[Metric]]) -> None:
        result, window = src.read()
        path = str(src.tail.path)
        records: list[R] = []
        unparsed = 0
        examples: list[str] = []
        for line in result.lines:
            if not line.strip():
                continue
            try:
                records.append(parse(line))
            except ValueError as e:  # LogParseError / FrontendParseError: counted, sampled, never fatal
                unparsed += 1
                if len(examples) < self.config.error_samples:
                    examples.append(f"{e} in {redact(line)!r}")
        if unparsed:
            out.errors.append(CollectError(path, "parse",
                f"{unparsed} of {len(result.lines)} lines unparsable this round; e.g. " + " | ".join(examples)))
        if result.missing:
            out.errors.append(CollectError(path, "no_reading", f"log {path} does not exist (yet)"))
        if result.error:
            out.errors.append(CollectError(path, result.error_kind, f"{result.error}: this log is not read until "
                                                                    "it can be opened (the collector's user?)"))
        out.metrics.append(metric(src.metric_name, {
            "lines": float(len(result.lines)), "parsed": float(len(records)), "unparsed": float(unparsed),
            "rotations": float(result.rotated), "truncations": float(result.truncated),
            "truncations_unrecovered": float(result.unrecovered),
            "overlong": float(result.overlong), "backlog": result.backlog,
        }, {"host": self.config.host, "path": path}, now))
        out.metrics.extend(emit(records, window))
