"""Active probes against Keystone: token validation and S3 signature validation, timed per request.

- ``token_validate``: ``GET /v3/auth/tokens`` with ``X-Auth-Token`` (the probe's service token) and
  ``X-Subject-Token`` (the token being validated), what every OpenStack service's auth middleware
  does for each API call.
- ``s3_signature``: ``POST /v3/s3tokens`` with an EC2 key id, a SigV4 string-to-sign and its
  signature, what Ceph RadosGW does for each signed S3 request (needs a service/admin-role token).

The service token is issued once (password auth, project scope) and reused until near expiry,
like keystonemiddleware. Each HTTP failure maps to one clear :class:`CollectError`: Keystone down
(``unreachable``), too slow (``timeout``), 401 / 403 on the service token (``auth``, distinct
messages). No message ever contains the password, the EC2 secret or a token.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from dataclasses import dataclass, field

import requests

from opsloop.bounded_http import request as bounded_request
from opsloop.collect.types import CollectError

from . import sigv4
from .credentials import ProbeCredentials

TOKEN_REFRESH_MARGIN_S = 120.0
PROBE_BUCKET_PATH = "/opsloop-probe/"
PROBE_S3_HOST = "s3.opsloop.invalid"
MAX_REPLY_BYTES = 8 * 1024 * 1024  # a token with its catalog is tens of KB


@dataclass(slots=True)
class ProbeResult:
    probe: str
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)  # non-success outcomes: "401", "timeout", ...

    @property
    def errors(self) -> int:
        return sum(self.statuses.values())


class ProbeFailure(Exception):
    """Stops the remaining samples of a probe (or of the round) with one CollectError."""

    def __init__(self, error: CollectError, status: str, stop_round: bool = False) -> None:
        super().__init__(error.message)
        self.error = error
        self.status = status
        self.stop_round = stop_round


def _keystone_message(resp: requests.Response) -> str:
    """Keystone's own error text ({"error": {"message": ...}}), short; it never echoes secrets."""
    try:
        msg = resp.json().get("error", {}).get("message", "")
    except (ValueError, AttributeError):
        msg = ""
    msg = " ".join(str(msg).split())[:160]
    return f": {msg}" if msg else ""


def _iso_seconds(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class KeystoneProber:
    def __init__(self, url: str, credentials: ProbeCredentials, timeout_s: float, samples: int,
                 region: str = "us-east-1") -> None:
        self.url = url.rstrip("/")
        self.credentials = credentials
        self.timeout_s = timeout_s
        self.samples = samples
        self.region = region
        self._session = requests.Session()
        self._token: str | None = None
        self._token_expires = 0.0  # time.monotonic()

    def close(self) -> None:
        self._session.close()

    # --- the service token -------------------------------------------------------------------
    def _issue_token(self) -> str:
        c = self.credentials
        body = {"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": c.username, "domain": {"name": c.user_domain},
                "password": c.password.get_secret_value()}}},
            "scope": {"project": {"name": c.project, "domain": {"name": c.project_domain}}},
        }}
        target = f"{self.url}/v3/auth/tokens"
        resp = self._request("POST", target, "service_token", json=body)
        if resp.status_code == 401:
            raise ProbeFailure(CollectError(target, "auth",
                f"Keystone refused the probe's service credentials (401 on POST /v3/auth/tokens for user "
                f"{c.username!r}, project {c.project!r}): wrong password, unknown user/project or user disabled"
                f"{_keystone_message(resp)}"), "401", stop_round=True)
        if resp.status_code != 201 or "X-Subject-Token" not in resp.headers:
            raise ProbeFailure(self._status_error(target, resp, "issuing the service token"),
                               str(resp.status_code), stop_round=True)
        # The lifetime on Keystone's clock (expires_at - issued_at), counted down on our monotonic clock:
        # expires_at against our wall clock took every token for expired on a host an hour ahead, and a
        # token was issued per probe request.
        try:
            token = resp.json()["token"]
            expires, issued = (_iso_seconds(token[k]) for k in ("expires_at", "issued_at"))
            lifetime = expires - issued
        except (ValueError, KeyError, TypeError, AttributeError):
            lifetime = 600.0  # unknown expiry: re-issue in 10 minutes
        self._token_expires = time.monotonic() + lifetime
        self._token = resp.headers["X-Subject-Token"]
        return self._token

    def service_token(self) -> str:
        if self._token is None or time.monotonic() > self._token_expires - TOKEN_REFRESH_MARGIN_S:
            return self._issue_token()
        return self._token

    def forget_token(self) -> None:
        self._token = None

    # --- HTTP plumbing -----------------------------------------------------------------------
    def _request(self, method: str, target: str, probe: str, **kwargs: object) -> requests.Response:
        try:
            # the whole reply within timeout_s ("per request"): a Keystone trickling its body held the round
            return bounded_request(self._session, method, target, timeout_s=self.timeout_s,
                                   total_s=self.timeout_s, max_bytes=MAX_REPLY_BYTES, **kwargs)
        except requests.Timeout:
            raise ProbeFailure(CollectError(target, "timeout",
                f"Keystone did not answer {method} {target.removeprefix(self.url)} within {self.timeout_s:g} s "
                f"({probe})"), "timeout", stop_round=True) from None
        except requests.ConnectionError as e:
            reason = type(e.__context__ or e).__name__
            raise ProbeFailure(CollectError(target, "unreachable",
                f"Keystone at {self.url} is unreachable ({reason}; is it running and listening?)"),
                "unreachable", stop_round=True) from None
        except requests.RequestException as e:  # a reply over MAX_REPLY_BYTES
            raise ProbeFailure(CollectError(target, "tool", f"Keystone's reply to {method} "
                f"{target.removeprefix(self.url)} ({probe}): {e}"), "error", stop_round=True) from None

    def _status_error(self, target: str, resp: requests.Response, what: str) -> CollectError:
        kind = "auth" if resp.status_code in (401, 403) else "tool"
        return CollectError(target, kind, f"Keystone answered HTTP {resp.status_code} {what}{_keystone_message(resp)}")

    # --- the probes --------------------------------------------------------------------------
    def _validate_once(self) -> float:
        token = self.service_token()
        target = f"{self.url}/v3/auth/tokens"
        headers = {"X-Auth-Token": token, "X-Subject-Token": token}
        started = time.perf_counter()
        resp = self._request("GET", target, "token_validate", headers=headers)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        if resp.status_code == 200:
            return elapsed_ms
        if resp.status_code == 401:
            self.forget_token()  # expired or revoked: issue a fresh one next time
            raise ProbeFailure(CollectError(target, "auth",
                "Keystone rejected the probe's service token (401 on GET /v3/auth/tokens): expired or revoked; "
                f"a new token is issued next round{_keystone_message(resp)}"), "401")
        if resp.status_code == 403:
            raise ProbeFailure(CollectError(target, "auth",
                "the probe's service token may not validate tokens (403 on GET /v3/auth/tokens, policy "
                f"identity:validate_token): give user {self.credentials.username!r} the service or admin role"
                f"{_keystone_message(resp)}"), "403")
        raise ProbeFailure(self._status_error(target, resp, "validating a token"), str(resp.status_code))

    def _s3_once(self) -> float:
        c = self.credentials
        assert c.ec2_access is not None and c.ec2_secret is not None
        token = self.service_token()
        signed = sigv4.sign_request(c.ec2_access, c.ec2_secret.get_secret_value(), "GET", PROBE_BUCKET_PATH,
                                    PROBE_S3_HOST, region=self.region)
        body = sigv4.s3tokens_body(c.ec2_access, signed.string_to_sign, signed.signature, signed.x_amz_date)
        target = f"{self.url}/v3/s3tokens"
        started = time.perf_counter()
        resp = self._request("POST", target, "s3_signature", json=body, headers={"X-Auth-Token": token})
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        if resp.status_code == 200:
            return elapsed_ms
        if resp.status_code == 403:
            raise ProbeFailure(CollectError(target, "auth",
                "the probe's service token may not call POST /v3/s3tokens (403, policy identity:s3tokens_validate):"
                f" give user {c.username!r} the service or admin role{_keystone_message(resp)}"), "403")
        if resp.status_code == 401:
            message = _keystone_message(resp)
            if "signature" in message.lower() or "ec2" in message.lower():
                text = f"Keystone rejected the probe's S3 signature for key {c.ec2_access!r} (401){message}"
            else:
                self.forget_token()
                text = f"Keystone rejected the probe's service token on POST /v3/s3tokens (401){message}"
            raise ProbeFailure(CollectError(target, "auth", text), "401")
        if resp.status_code == 404:
            raise ProbeFailure(CollectError(target, "auth",
                f"Keystone does not know the probe's EC2 access key {c.ec2_access!r} (404){_keystone_message(resp)}"),
                "404")
        raise ProbeFailure(self._status_error(target, resp, "validating an S3 signature"), str(resp.status_code))

    def run(self, deadline: float) -> tuple[list[ProbeResult], list[CollectError]]:
        """Up to ``samples`` requests per probe, stopping at ``deadline`` (time.monotonic())."""
        probes = [("token_validate", self._validate_once)]
        if self.credentials.ec2_access:
            probes.append(("s3_signature", self._s3_once))
        results: list[ProbeResult] = []
        errors: list[CollectError] = []
        for name, once in probes:
            result = ProbeResult(name)
            results.append(result)
            first_error: CollectError | None = None
            for _ in range(self.samples):
                if time.monotonic() >= deadline:
                    break
                try:
                    result.latencies_ms.append(once())
                except ProbeFailure as f:
                    result.statuses[f.status] += 1
                    first_error = first_error or f.error
                    if f.stop_round:
                        errors.append(first_error)
                        if f.error is not first_error:
                            errors.append(f.error)
                        return results, errors
            if first_error is not None:
                errors.append(first_error)
        return results, errors
