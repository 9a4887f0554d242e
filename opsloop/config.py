"""One validated configuration file for every opsloop service, with sane defaults.

The file is YAML; every section is optional. ``opsloop config check FILE`` validates it and prints
the effective configuration. Collector sections (``collectors.<name>``) are validated by the
collector's own ``Config`` model (``collectors/<name>/__init__.py``), so the one file is checked
as a whole, and an error names the section, field and value.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUN_DIR = REPO_ROOT / ".run"
LOOPBACK = "127.0.0.1"


class ConfigError(ValueError):
    """The configuration file is invalid; the message names the section, field and value."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KafkaSettings(_Section):
    bootstrap_servers: str = f"{LOOPBACK}:29092"
    client_id: str = "opsloop"
    partitions: int = Field(default=4, ge=1, le=1024)  # for topics opsloop creates itself
    replication_factor: int = Field(default=1, ge=1, le=5)


class StackSettings(_Section):
    """Local real components for `make run`, tests and benchmarks (all on loopback)."""

    data_dir: Path = DEFAULT_RUN_DIR / "stack"
    bind: str = LOOPBACK
    kafka_port: int = Field(default=29092, ge=1, le=65535)
    kafka_controller_port: int = Field(default=29093, ge=1, le=65535)
    prometheus_port: int = Field(default=29090, ge=1, le=65535)
    alertmanager_port: int = Field(default=29094, ge=1, le=65535)
    kafka_heap: str = "512m"
    scrape_interval_s: float = Field(default=5.0, gt=0)
    scrape_targets: list[str] = Field(default_factory=lambda: [f"{LOOPBACK}:29100", f"{LOOPBACK}:29101"])


class StreamSettings(_Section):
    app_id: str = "opsloop-streams"
    data_dir: Path = DEFAULT_RUN_DIR / "streams"
    metrics_bind: str = LOOPBACK
    metrics_port: int = Field(default=29100, ge=0, le=65535)
    web_port: int = Field(default=29106, ge=1, le=65535)  # Faust's own web server, loopback only
    batch_size: int = Field(default=2000, ge=1, le=100_000)
    batch_within_s: float = Field(default=0.2, gt=0, le=10)
    producer_linger_s: float = Field(default=0.02, ge=0, le=1)
    # Longest a consumer fetch waits at the broker for data (Faust fixes 1500 ms, which stalls a
    # backlog whenever one partition is at its end: streams/runtime/transport.py).
    fetch_max_wait_ms: int = Field(default=100, ge=1, le=1500)
    log_level: str = "info"
    # How long Kafka waits for a dead worker before handing its partitions to another (Faust's
    # broker_session_timeout): low enough for a quick take-over after a crash.
    session_timeout_s: float = Field(default=10.0, ge=6, le=300)
    # A series silent for this long is dropped from the exported gauges (stale, not zero).
    series_ttl_s: float = Field(default=120.0, gt=0)


class CollectorRuntimeSettings(_Section):
    interval_s: float = Field(default=15.0, gt=0)
    timeout_s: float = Field(default=10.0, gt=0)
    jitter_s: float = Field(default=0.0, ge=0)
    spool_dir: Path = DEFAULT_RUN_DIR / "spool"
    spool_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    metrics_bind: str = LOOPBACK
    metrics_port: int = Field(default=29101, ge=0, le=65535)
    send_timeout_s: float = Field(default=10.0, gt=0)


class Settings(_Section):
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    stack: StackSettings = Field(default_factory=StackSettings)
    stream: StreamSettings = Field(default_factory=StreamSettings)
    collector: CollectorRuntimeSettings = Field(default_factory=CollectorRuntimeSettings)
    collectors: dict[str, Any] = Field(default_factory=dict)
    controllers: dict[str, Any] = Field(default_factory=dict)

    @field_validator("collectors")
    @classmethod
    def _known_collectors(cls, v: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, section in v.items():
            model = collector_config_model(name)
            try:
                out[name] = model.model_validate(section or {})
            except ValidationError as e:
                from opsloop.wire import describe_validation_error

                raise ValueError(describe_validation_error(e, prefix=f"{name}.")) from None
        return out


def collector_config_model(name: str) -> type[BaseModel]:
    try:
        mod = importlib.import_module(f"collectors.{name}")
    except ModuleNotFoundError:
        raise ValueError(f"unknown collector {name!r} (no folder collectors/{name}/)") from None
    model = getattr(mod, "Config", None)
    if model is None:
        raise ValueError(f"collectors/{name} has no Config model")
    return model


def load_settings(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Read and validate the config file (or the defaults when ``path`` is None)."""
    doc: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ConfigError(f"config file {p}: {e.strerror}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p}: not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {p}: top level must be a mapping, got {type(loaded).__name__}")
        doc = loaded or {}
    if overrides:
        doc = _deep_merge(doc, overrides)
    try:
        return Settings.model_validate(doc)
    except ValidationError as e:
        from opsloop.wire import describe_validation_error

        where = f"config file {path}" if path else "configuration"
        raise ConfigError(f"{where}: {describe_validation_error(e)}") from None


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
