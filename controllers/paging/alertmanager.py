"""``POST /api/v2/alerts`` to every configured Alertmanager, and the back-off while none answers.

Alertmanager deduplicates by label set, so sending the same alert again (to the same or to every
member of an HA pair) is safe; that is what makes the retry loop simple. A 400 (its validation: label
names, startsAt after endsAt ...) or a 422 (its API schema: a generatorURL that is no URI) rejects the
whole body: the batch is then sent alert by alert, so one malformed alert cannot block the others. A 422
was taken for an outage: the batch holding the alert was retried whole, with back-off, for ever.

A 413 (a proxy in front of Alertmanager: the body over its limit) was taken for an outage too: the batch was
retried whole for ever, and every page behind it waited. Bodies are now bounded in bytes as well as alerts
(``MAX_POST_BYTES``, under nginx's 1 MiB default); a batch answered 400, 422 or 413 is halved until the alerts
refused are alone, and one alert refused alone (413 included) is rejected, the rest accepted.

Only Alertmanager's own answer counts as accepted: a 200 with an empty (or JSON) body to the POST itself. A
200 from a captive proxy (an HTML page) and a 301/302/303, which requests follows as a GET (Alertmanager's
list of alerts: 200), counted the alerts delivered and lost them. 307/308 keep the POST and are followed.
Every other answer is an AlertmanagerError (retried with back-off), its message naming the likely cause
(401/403: the credentials, 404: the URL); a 429's or 503's ``Retry-After`` is kept on the error.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson
import requests

from opsloop.bounded_http import request as bounded_request
from opsloop.log import get_logger
from opsloop.redact import redact_credentials

from opsloop.controllers.paging.book import TOO_LARGE

log = get_logger("paging.alertmanager")


MAX_REPLY_BYTES = 1024 * 1024  # Alertmanager answers a post with a few bytes (an error: a line)
MAX_ALERTS_PER_POST = 250   # 0.5-1 s of a real Alertmanager's work (2 shared cores): inside request_timeout_s
MAX_POST_BYTES = 512 * 1024  # a body's bytes: under the 1 MiB nginx (and ingress-nginx) take by default
MAX_RETRY_AFTER_S = 3600.0   # a Retry-After past this is not believed (the back-off cap bounds it further)
REFUSED = (400, 422)        # the alert, not Alertmanager: sending it again gets the same answer
SPLIT = (*REFUSED, 413)     # a batch answered so is halved: only the alerts refused alone are rejected
HINTS = {401: "the credentials in alertmanager_urls (or the proxy's) are refused",
         403: "the credentials in alertmanager_urls (or the proxy's) are refused",
         404: "no Alertmanager API v2 at this URL: alertmanager_urls is the base URL, without /api/v2",
         405: "no Alertmanager API v2 at this URL: alertmanager_urls is the base URL, without /api/v2"}


class AlertmanagerError(RuntimeError):
    """No Alertmanager accepted the alerts; the message names each URL and what went wrong.
    ``retry_after_s``: every Alertmanager that answered asked for that long at least (429/503 Retry-After)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


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
        waits: list[float | None] = []
        result: PostResult | None = None
        bodies = [orjson.dumps(a) for a in alerts]   # once for every URL: bytes counted, then sent as they are
        for url in self.urls:
            try:
                r = self._post_one(url, alerts, bodies)
            except (requests.RequestException, AlertmanagerError) as e:
                errors.append(redact_credentials(f"{url}: {e}"))
                waits.append(e.retry_after_s if isinstance(e, AlertmanagerError) else None)
                continue
            if result is None or r.accepted > result.accepted:
                result = r
        if result is None:
            # waited for only when every one asked: one down (no Retry-After) is tried again at the back-off
            asked = [w for w in waits if w is not None]
            wait = min(asked) if asked and len(asked) == len(waits) else None
            raise AlertmanagerError("; ".join(errors), retry_after_s=wait)
        if errors:
            log.warning("alertmanager_partial_failure", errors=errors)
        return result

    def _post_one(self, url: str, alerts: list[dict[str, Any]], bodies: list[bytes]) -> PostResult:
        # Alertmanager's time grows with the body (10^4 alerts, 10.8 MB: 20 s, past any sane timeout,
        # so a finding flood was retried whole and never delivered): bounded bodies, one after another.
        # Bounded in bytes too: a proxy in front answers 413 past its limit (nginx: 1 MiB).
        out = PostResult()
        endpoint = f"{url}/api/v2/alerts"
        start = size = 0
        for i, body in enumerate(bodies):
            if i > start and (i - start >= MAX_ALERTS_PER_POST or size + len(body) + 1 > MAX_POST_BYTES):
                self._post_chunk(endpoint, alerts[start:i], bodies[start:i], out)
                start, size = i, 0
            size += len(body) + 1
        self._post_chunk(endpoint, alerts[start:], bodies[start:], out)
        return out

    def _post_chunk(self, endpoint: str, alerts: list[dict[str, Any]], bodies: list[bytes], out: PostResult) -> None:
        """Post ``alerts`` (``bodies``: each encoded) and add what came of them to ``out``."""
        resp = self._post_json(endpoint, bodies)
        if _accepted(resp):
            out.accepted += len(alerts)
            return
        if resp.status_code in SPLIT and len(alerts) > 1:
            # One bad (or too large) alert spoils the batch: halves, until the ones refused are alone.
            mid = len(alerts) // 2
            self._post_chunk(endpoint, alerts[:mid], bodies[:mid], out)
            self._post_chunk(endpoint, alerts[mid:], bodies[mid:], out)
            return
        if resp.status_code in REFUSED:
            out.rejected.append((alerts[0], resp.text.strip()[:300]))
            return
        if resp.status_code == 413:
            # this alert alone is over the proxy's limit: sent again it is refused again, and its fallback is short
            out.rejected.append((alerts[0], f"{TOO_LARGE} (payload too large, {len(bodies[0])} bytes): "
                                            f"{_excerpt(resp)}"[:300]))
            return
        raise _error(resp)

    def _post_json(self, endpoint: str, bodies: list[bytes]) -> requests.Response:
        # The whole reply within timeout_s, not each read: an Alertmanager (or proxy) answering a byte
        # now and then held the paging loop, and the next member of an HA pair was never tried.
        return bounded_request(self.session, "POST", endpoint, data=b"[" + b",".join(bodies) + b"]",
                               headers={"Content-Type": "application/json"}, timeout_s=self.timeout_s,
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

    def at_least(self, now: float, delay_s: float) -> float:
        """After :meth:`failed`: wait ``delay_s`` (a Retry-After) if longer, at most ``max_s``; the delay in force."""
        self.not_before = max(self.not_before, now + min(max(delay_s, 0.0), self.max_s))
        return self.not_before - now


def _accepted(resp: requests.Response) -> bool:
    """Alertmanager's 200 to the POST itself: an empty body (or JSON). A captive proxy's HTML page, or the list
    of alerts of a GET a 301/302/303 turned the POST into, is not: those alerts never reached it."""
    if resp.status_code != 200 or resp.request.method != "POST":
        return False
    body = resp.content.strip()
    if not body:
        return True
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


def _excerpt(resp: requests.Response) -> str:
    return " ".join(resp.text.split())[:200]


def _retry_after(resp: requests.Response) -> float | None:
    """A Retry-After of seconds (the HTTP-date form is rare from proxies: the back-off applies then)."""
    try:
        value = float(resp.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if 0 <= value <= MAX_RETRY_AFTER_S else None


def _error(resp: requests.Response) -> AlertmanagerError:
    """What an answer that accepted nothing says, with its likely cause: retried with back-off."""
    status = resp.status_code
    if resp.request.method != "POST":   # requests follows 301/302/303 with a GET, 307/308 with the POST
        hops = [r for r in resp.history if r.is_redirect]
        first = hops[0] if hops else resp
        return AlertmanagerError(f"HTTP {first.status_code} redirect to {first.headers.get('Location', '?')[:200]}: "
                                 f"the POST became a {resp.request.method} (HTTP {status}), no alert was sent; "
                                 f"set alertmanager_urls to the URL it redirects to")
    if status == 200:
        return AlertmanagerError(f"HTTP 200 that is not Alertmanager's (Content-Type "
                                 f"{resp.headers.get('Content-Type', 'none')[:60]}: {_excerpt(resp)[:120]}): "
                                 f"a proxy answered in its place, no alert was taken")
    if 300 <= status < 400:
        return AlertmanagerError(f"HTTP {status} redirect to {resp.headers.get('Location', '?')[:200]}: not "
                                 f"followed; set alertmanager_urls to the URL it redirects to")
    hint = HINTS.get(status)
    return AlertmanagerError(f"HTTP {status}: {_excerpt(resp)}" + (f" ({hint})" if hint else ""),
                             retry_after_s=_retry_after(resp) if status in (429, 503) else None)
