"""Per-round aggregation of parsed log records into samples (per endpoint, per credential)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from opsloop.records import Metric, metric

from .latency import percentile, summarize
from .nginx_log import FrontendRecord
from .uwsgi_log import AccessRecord

OTHER = "_other"  # the bucket for endpoints/credentials beyond the per-round series limit


def keystone_requests(records: Iterable[AccessRecord], host: str, window_s: float, max_endpoints: int,
                      timestamp: float) -> list[Metric]:
    """``keystone_requests`` per (method, endpoint): count, rate, latency, status classes."""
    groups: dict[tuple[str, str], list[AccessRecord]] = defaultdict(list)
    for r in records:
        groups[(r.method, r.endpoint)].append(r)
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    if len(ranked) > max_endpoints:
        rest = [r for _, rs in ranked[max_endpoints - 1:] for r in rs]
        ranked = ranked[:max_endpoints - 1] + [((OTHER, OTHER), rest)]
    out = []
    for (method, endpoint), rs in ranked:
        fields: dict[str, float] = dict(summarize([r.msecs for r in rs]))
        fields["rate_per_s"] = len(rs) / window_s if window_s > 0 else 0.0
        fields["status_2xx"] = float(sum(1 for r in rs if 200 <= r.status < 300))
        fields["status_4xx"] = float(sum(1 for r in rs if 400 <= r.status < 500))
        fields["status_5xx"] = float(sum(1 for r in rs if r.status >= 500))
        out.append(metric("keystone_requests", fields,
                          {"host": host, "method": method, "endpoint": endpoint}, timestamp))
    return out


@dataclass(slots=True)
class _CredentialStats:
    requests: int = 0
    keystone_validations: int = 0
    small: int = 0
    bytes_sent: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)


def frontend_metrics(records: list[FrontendRecord], host: str, local_keys: frozenset[str], top_n: int,
                     small_limit: int, window_s: float, timestamp: float) -> list[Metric]:
    """``s3_frontend_requests`` (round totals, the source documents' small-request p95) and ``s3_frontend_credential``
    (per access key, heaviest first, ``rank`` 1 = heaviest)."""
    small_latencies = [r.request_time_ms for r in records if r.is_small(small_limit)]
    signed = [r for r in records if r.access_key is not None]
    validated = [r for r in signed if r.access_key not in local_keys]
    totals: dict[str, float] = {
        "requests": float(len(records)),
        "rate_per_s": len(records) / window_s if window_s > 0 else 0.0,
        "signed": float(len(signed)),
        "anonymous": float(len(records) - len(signed)),
        "keystone_validations": float(len(validated)),
        "small_requests": float(len(small_latencies)),
        "credentials": float(len({r.access_key for r in signed})),
    }
    if small_latencies:
        ordered = sorted(small_latencies)
        totals["small_p50_ms"] = percentile(ordered, 50)
        totals["small_p95_ms"] = percentile(ordered, 95)
    if records:
        totals["p95_ms"] = percentile(sorted(r.request_time_ms for r in records), 95)
    out = [metric("s3_frontend_requests", totals, {"host": host}, timestamp)]

    per_key: dict[str, _CredentialStats] = defaultdict(_CredentialStats)
    for r in signed:
        s = per_key[r.access_key]  # type: ignore[index]
        s.requests += 1
        s.keystone_validations += r.access_key not in local_keys
        s.small += r.is_small(small_limit)
        s.bytes_sent += r.body_bytes_sent
        s.errors += r.status >= 400
        s.latencies.append(r.request_time_ms)
    ranked = sorted(per_key.items(), key=lambda kv: (-kv[1].requests, kv[0]))
    if len(ranked) > top_n:
        other = _CredentialStats()
        for _, s in ranked[top_n:]:
            other.requests += s.requests
            other.keystone_validations += s.keystone_validations
            other.small += s.small
            other.bytes_sent += s.bytes_sent
            other.errors += s.errors
            other.latencies.extend(s.latencies)
        ranked = ranked[:top_n] + [(OTHER, other)]
    for rank, (key, s) in enumerate(ranked, start=1):
        fields = {
            "rank": float(rank) if key != OTHER else 0.0,
            "requests": float(s.requests),
            "share": s.requests / len(signed),
            "keystone_validations": float(s.keystone_validations),
            "small_requests": float(s.small),
            "bytes_sent": float(s.bytes_sent),
            "errors": float(s.errors),
            "p95_ms": percentile(sorted(s.latencies), 95),
        }
        out.append(metric("s3_frontend_credential", fields, {"host": host, "access_key": key}, timestamp))
    return out
