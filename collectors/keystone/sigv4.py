"""AWS Signature V4 for S3, and the body of Keystone's ``POST /v3/s3tokens``.

This is the call Ceph RadosGW (and Swift's s3token middleware) makes for every signed S3
request when credentials live in Keystone: it sends the access key id, the base64 of the
string-to-sign and the client's signature; Keystone recomputes the signature with the stored
secret (keystone/api/s3tokens.py: ``_calculate_signature_v4``) and answers with a token.
The probe and the test gateway build exactly that body, so the probe measures what RGW pays.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


def amz_date(now: dt.datetime | None = None) -> str:
    """``20260101T120000Z`` in UTC, the X-Amz-Date header value."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return now.astimezone(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str = "s3") -> bytes:
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def canonical_request(method: str, path: str, query: str, host: str, x_amz_date: str,
                      payload_hash: str = UNSIGNED_PAYLOAD) -> str:
    """The canonical request for the two signed headers ``host;x-amz-date``."""
    canonical_path = quote(path or "/", safe="/~")
    pairs = sorted(
        (quote(k, safe="~"), quote(v, safe="~"))
        for k, _, v in (p.partition("=") for p in query.split("&") if p)
    )
    canonical_query = "&".join(f"{k}={v}" for k, v in pairs)
    headers = f"host:{host.strip()}\nx-amz-date:{x_amz_date}\n"
    return "\n".join([method.upper(), canonical_path, canonical_query, headers, "host;x-amz-date", payload_hash])


def string_to_sign(canonical: str, x_amz_date: str, region: str, service: str = "s3") -> str:
    scope = f"{x_amz_date[:8]}/{region}/{service}/aws4_request"
    return "\n".join([ALGORITHM, x_amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])


def sign(secret: str, to_sign: str) -> str:
    """Hex signature of a string-to-sign whose scope line names date, region and service."""
    date, region, service, _ = to_sign.split("\n")[2].split("/")
    return hmac.new(signing_key(secret, date, region, service), to_sign.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class SignedRequest:
    access_key: str
    x_amz_date: str
    string_to_sign: str
    signature: str

    @property
    def authorization(self) -> str:
        scope = self.string_to_sign.split("\n")[2]
        return (f"{ALGORITHM} Credential={self.access_key}/{scope}, "
                f"SignedHeaders=host;x-amz-date, Signature={self.signature}")


def sign_request(access_key: str, secret: str, method: str, path: str, host: str, query: str = "",
                 region: str = "us-east-1", now: dt.datetime | None = None) -> SignedRequest:
    date = amz_date(now)
    to_sign = string_to_sign(canonical_request(method, path, query, host, date), date, region)
    return SignedRequest(access_key, date, to_sign, sign(secret, to_sign))


def s3tokens_body(access_key: str, to_sign: str, signature: str, x_amz_date: str | None = None) -> dict:
    """The JSON body RadosGW posts to ``/v3/s3tokens`` (the ``token`` is the base64 string-to-sign)."""
    creds: dict = {
        "access": access_key,
        "token": base64.urlsafe_b64encode(to_sign.encode()).decode(),
        "signature": signature,
    }
    if x_amz_date:
        # Keystone checks this against [credential] auth_ttl: a replayed body expires.
        creds["headers"] = {"X-Amz-Date": x_amz_date}
    return {"credentials": creds}
