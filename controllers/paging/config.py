"""The ``controllers.paging`` section of the opsloop config file.

    controllers:
      paging:
        alertmanager_urls: ["http://127.0.0.1:29094"]
        resend_interval_s: 60
        dashboard_base_url: https://grafana.corp     # default $OPSLOOP_DASHBOARD_BASE_URL, else http://127.0.0.1:3000
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from opsloop.config import DEFAULT_RUN_DIR, LOOPBACK, Settings
from opsloop.runbooks import dashboard_base_url, runbook_base_url
from opsloop.validation import describe_validation_error

from opsloop.controllers.paging.book import DEFAULT_MAX_PENDING_RESOLVES, DEFAULT_RESEND_RESOLVED_S


class PagingConfigError(ValueError):
    """The paging section is invalid; the message names the field and value."""


class PagingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # Alertmanager base URLs; an HA pair gets every alert (each instance deduplicates itself).
    alertmanager_urls: list[str] = Field(default_factory=lambda: [f"http://{LOOPBACK}:29094"], min_length=1)
    topic: str = Field(default="findings", min_length=1)
    group_id: str = Field(default="opsloop-paging", min_length=1)
    audit_topic: str = Field(default="audit", min_length=1)
    # A new consumer group starts at the oldest finding (nothing open is missed); it does not page
    # until it has caught up with the topic, so findings opened and cleared long ago never page.
    start_offset: Literal["earliest", "latest"] = "earliest"
    min_severity: Literal["warning", "critical"] = "warning"
    # While a finding is open its alert is re-sent this often, with endsAt = now + ends_after_s:
    # if the actuator dies, Alertmanager resolves the alert by itself after ends_after_s.
    resend_interval_s: float = Field(default=60.0, gt=0, le=3600)
    ends_after_s: float | None = Field(default=None, gt=0)
    request_timeout_s: float = Field(default=5.0, gt=0, le=120)
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    # opsloop.runbooks: one base per deployment (from the environment: a bad one is logged, the default used)
    dashboard_base_url: str = Field(default_factory=dashboard_base_url)
    runbook_base_url: str = Field(default_factory=runbook_base_url)
    metrics_bind: str = LOOPBACK
    metrics_port: int = Field(default=29103, ge=0, le=65535)
    state_file: Path = DEFAULT_RUN_DIR / "paging" / "state.json"
    poll_timeout_s: float = Field(default=1.0, gt=0, le=30)
    # Resolves queued while Alertmanager is away or during a replay (about 1.4 KiB each): beyond this the
    # oldest for findings never open here go first (controllers/paging/book.py), each one counted.
    max_pending_resolves: int = Field(default=DEFAULT_MAX_PENDING_RESOLVES, ge=1, le=1_000_000)
    # A resolve delivered is re-sent (its own endsAt) at resend_interval_s for this long, as Prometheus does: an
    # Alertmanager restarted before it notified the resolve (alerts are not persisted) still notifies it. 0: once.
    resend_resolved_s: float = Field(default=DEFAULT_RESEND_RESOLVED_S, ge=0, le=86_400)

    @field_validator("alertmanager_urls")
    @classmethod
    def _http_urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"Alertmanager URL {url!r} must start with http:// or https://")
        return [u.rstrip("/") for u in v]

    @field_validator("dashboard_base_url", "runbook_base_url")
    @classmethod
    def _link_base(cls, v: str) -> str:
        # every alert's links start with it: without a scheme Alertmanager refused each alert's generatorURL
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} must start with http:// or https:// (it begins every alert's links)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "PagingConfig":
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"backoff_max_s ({self.backoff_max_s}) is below backoff_initial_s "
                             f"({self.backoff_initial_s})")
        if self.ends_after_s is not None and self.ends_after_s <= self.resend_interval_s:
            raise ValueError(f"ends_after_s ({self.ends_after_s}) must exceed resend_interval_s "
                             f"({self.resend_interval_s}), else alerts resolve between re-sends")
        return self

    @property
    def alert_ttl_s(self) -> float:
        """endsAt offset of a firing alert: 4 re-send intervals unless set (Prometheus uses the same factor)."""
        return self.ends_after_s if self.ends_after_s is not None else 4 * self.resend_interval_s


def paging_config(settings: Settings, overrides: dict[str, Any] | None = None) -> PagingConfig:
    """The validated ``controllers.paging`` section (defaults when absent), with CLI overrides."""
    section = dict(settings.controllers.get("paging") or {})
    section.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return PagingConfig.model_validate(section)
    except ValidationError as e:
        raise PagingConfigError(f"controllers.paging: {describe_validation_error(e)}") from None
