"""The ``collectors.keystone`` section of opsloop.yaml. Every part is optional: a collector may
probe only, read only logs, or anything in between; at least one source must be configured."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

# NoBoolNumbers: YAML reads an unquoted yes/no/on/off as a boolean, which pydantic took as the number 1 or 0
from opsloop.validation import NoBoolNumbers


class ProbeConfig(NoBoolNumbers):
    """Active probes. Credentials come from ``credentials_file`` and/or the environment, never from here."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = True
    samples: int = Field(default=5, ge=1, le=200, description="requests per probe and round")
    timeout_s: float = Field(default=5.0, gt=0, le=60, description="per request")
    credentials_file: Path | None = None
    env_prefix: str = Field(default="OPSLOOP_KEYSTONE_", pattern=r"^[A-Z][A-Z0-9_]*$")
    s3_region: str = Field(default="us-east-1", min_length=1, max_length=64)


class FrontendConfig(NoBoolNumbers):
    """nginx access logs of the S3 front end (log_format s3_keystone, see README.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    access_logs: list[Path] = Field(default_factory=list)
    # Keys provisioned locally in RadosGW (the operators' workaround): their requests are not Keystone-backed.
    local_access_keys: list[str] = Field(default_factory=list)
    top_credentials: int = Field(default=20, ge=1, le=1000, description="per-credential series kept per round")
    small_request_bytes: int = Field(default=65536, ge=1, description="the source documents' 'small request' limit")


class Config(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    host: str = Field(default_factory=socket.gethostname, min_length=1, max_length=128,
                      description="host tag (Kafka key) of every sample")
    url: str = Field(default="http://127.0.0.1:5000", description="Keystone base URL, without /v3")
    probes: ProbeConfig = Field(default_factory=ProbeConfig)
    uwsgi_stats: str | None = Field(default=None, description="127.0.0.1:1717, unix:/path or http://host:port")
    uwsgi_access_log: Path | None = None
    frontend: FrontendConfig = Field(default_factory=FrontendConfig)
    start_at: Literal["end", "start"] = Field(default="end", description="where a log is first read from")
    max_read_bytes: int = Field(default=16 * 1024 * 1024, ge=4096, description="per log and round")
    max_endpoints: int = Field(default=50, ge=1, le=1000, description="distinct endpoint series per round")
    error_samples: int = Field(default=3, ge=0, le=50, description="unparsable lines quoted per error")
    round_timeout_s: float = Field(default=20.0, gt=0, le=600)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https:// (got {v!r})")
        if v.endswith("/v3"):
            raise ValueError("url is Keystone's base URL: drop the trailing /v3")
        if "@" in v.split("//", 1)[1].split("/", 1)[0]:
            raise ValueError("url must not carry credentials (user:password@); use probes.credentials_file")
        return v

    @model_validator(mode="after")
    def _something_to_do(self) -> "Config":
        if not (self.probes.enabled or self.uwsgi_stats or self.uwsgi_access_log or self.frontend.access_logs):
            raise ValueError("nothing to collect: enable probes or set uwsgi_stats, uwsgi_access_log "
                             "or frontend.access_logs")
        return self
