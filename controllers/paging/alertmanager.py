"""``POST /api/v2/alerts`` to every configured Alertmanager, and the back-off while none answers.

Alertmanager deduplicates by label set, so sending the same alert again (to the same or to every
member of an HA pair) is safe; that is what makes the retry loop simple. A 400 (its validation: label
names, startsAt after endsAt ...) or a 422 (its API schema: a generatorURL that is no URI) rejects the
whole body: the batch is then sent alert by alert, so one malformed alert cannot block the others. A 422
was taken for an outage: the batch holding the alert was retried whole, with back-off, for ever.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import requests

from opsloop.bounded_http import request as bounded_request
from opsloop.log import get_logger
from opsloop.redact import redact_credentials

log = get_logger("paging.alertmanager")


MAX_REPLY_BYTES = 1024 * 1024  # Alertmanager answers a post with a few bytes (an error: a line)
MAX_ALERTS_PER_POST = 250   # 0.5-1 s of a real Alertmanager's work (2 shared cores): inside request_timeout_s
REFUSED = (400, 422)        # the alert, not Alertmanager: sending it again gets the same answer


class AlertmanagerError(RuntimeError):
    """No Alertmanager accepted the alerts; the message names each URL and what went wrong."""


@dataclass
class PostResult:
    accepted: int = 0                                  # alerts accepted by at least one Alertmanager
    # (alert, reason): will not retry; the very alert given, not a copy (the service finds its record by it)
    rejected: list[tuple[dict[str, Any], str]] = field(default_factory=list)


class AlertmanagerClient:
    def __init__(self, urls: list[str], timeout_s: float = 5.0) -> None:
        if not urls:
            raise ValueError("at least one Alertmanager URL is needed")
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = timeout_s
        self.session = requests.Session()

    def post(self, alerts: list[dict[str, Any]]) -> PostResult:
        """Deliver ``alerts``; raise AlertmanagerError when no Alertmanager took them (retry later)."""
        if not alerts:
            return PostResult()
        errors: list[str] = []
        result: PostResult | None = None
        for url in self.urls:
            try:
                r = self._post_one(url, alerts)
            except (requests.RequestException, AlertmanagerError) as e:
                errors.append(redact_credentials(f"{url}: {e}"))
                continue
            if result is None or r.accepted > result.accepted:
                result = r
        if result is None:
            raise AlertmanagerError("; ".join(errors))
        if errors:
            log.warning("alertmanager_partial_failure", errors=errors)
        return result

    def _post_one(self, url: str, alerts: list[dict[str, Any]]) -> PostResult:
        # Alertmanager's time grows with the body (10^4 alerts, 10.8 MB: 20 s, past any sane timeout,
        # so a finding flood was retried whole and never delivered): bounded bodies, one after another.
        out = PostResult()
        for i in range(0, len(alerts), MAX_ALERTS_PER_POST):
            part = self._post_chunk(url, alerts[i:i + MAX_ALERTS_PER_POST])
            out.accepted += part.accepted
            out.rejected += part.rejected
        return out

    def _post_chunk(self, url: str, alerts: list[dict[str, Any]]) -> PostResult:
        endpoint = f"{url}/api/v2/alerts"
        resp = self._post_json(endpoint, alerts)
        if resp.status_code == 200:
            return PostResult(accepted=len(alerts))
        if resp.status_code in REFUSED and len(alerts) > 1:
            # One bad alert spoils the batch: find it by sending one at a time.
            out = PostResult()
            for a in alerts:
                single = self._post_json(endpoint, [a])
                if single.status_code == 200:
                    out.accepted += 1
                elif single.status_code in REFUSED:
                    out.rejected.append((a, single.text.strip()[:300]))
                else:
                    raise AlertmanagerError(f"HTTP {single.status_code}: {single.text.strip()[:200]}")
            return out
        if resp.status_code in REFUSED:
            return PostResult(rejected=[(alerts[0], resp.text.strip()[:300])])
        raise AlertmanagerError(f"HTTP {resp.status_code}: {resp.text.strip()[:200]}")

    def _post_json(self, endpoint: str, body: list[dict[str, Any]]) -> requests.Response:
        # The whole reply within timeout_s, not each read: an Alertmanager (or proxy) answering a byte
        # now and then held the paging loop, and the next member of an HA pair was never tried.
        return bounded_request(self.session, "POST", endpoint, json=body, timeout_s=self.timeout_s,
                               total_s=self.timeout_s, max_bytes=MAX_REPLY_BYTES)

    def close(self) -> None:
        self.session.close()


class Backoff:
    """Exponential back-off with jitter: initial, 2x, 4x ... capped; reset on success."""

    def __init__(self, initial_s: float = 0.5, max_s: float = 30.0, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.failures = 0
        self.not_before = 0.0
        self._rng = rng or random.Random()

    def ready(self, now: float) -> bool:
        # more than max_s to wait means the wall clock stepped back: do not wait for the lost time
        return now >= self.not_before or self.not_before - now > self.max_s

    def failed(self, now: float) -> float:
        """Record a failure; returns the delay before the next attempt."""
        # the exponent stops growing once the cap is reached: 2 ** 1024 overflows a float (~6 h at 30 s)
        cap = min(self.max_s, self.initial_s * 2.0 ** min(self.failures, 64))
        delay = cap * (0.5 + 0.5 * self._rng.random())  # jitter: HA actuators do not retry in lockstep
        self.failures += 1
        self.not_before = now + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.not_before = 0.0

    def wait(self, now: float) -> float:
        return 0.0 if self.ready(now) else self.not_before - now
