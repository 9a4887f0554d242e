"""One validated configuration file for every opsloop service, with sane defaults.

The file is YAML; every section is optional. Where it is read from: the ``--config`` option, else
``$OPSLOOP_CONFIG``, else ``/etc/opsloop/opsloop.yaml`` if it exists, else the defaults. Any setting can
be overridden from the environment as ``OPSLOOP__<SECTION>__<KEY>=value`` (e.g. a secret:
``OPSLOOP__CONTROLLERS__PAGING__ALERTMANAGER_URLS``), so secrets need not sit in the file.

Section names say where the code lives: ``kafka``, ``stack``, ``stream`` (the Faust runtime) and
``collector`` are the core's own; ``collectors.<name>`` is validated by the collector's ``Config`` model
(``collectors/<name>/__init__.py``); the stage sections (``streams.detectors``, ``controllers.edge``,
``controllers.actuator``, ``controllers.paging``, ``audit``) are registered by name under the
``opsloop.config_sections`` entry-point group in pyproject.toml, so the core validates the whole file
without importing a stage by hand. ``opsloop config check FILE`` reports every error, one per line with
its path; old section names are accepted with a deprecation warning. A section model may define
``cross_section_errors(doc) -> list[str]`` for settings that contradict another section's (each line
names both keys); it runs once every section is valid alone.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import os
import pkgutil
import re
import stat
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from opsloop.dotted import get_dotted
from opsloop.kafka_security import KafkaSecurity
from opsloop.paths import state_dir
from opsloop.validation import NoBoolNumbers, YamlFileError, error_lines, parse_yaml, read_yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUN_DIR = state_dir()   # .run/ in a checkout, /var/lib/opsloop installed, or $OPSLOOP_STATE_DIR
LOOPBACK = "127.0.0.1"
CONFIG_ENV = "OPSLOOP_CONFIG"
DEFAULT_CONFIG_PATH = Path("/etc/opsloop/opsloop.yaml")
ENV_PREFIX = "OPSLOOP__"
# Settings whose environment value is taken verbatim, never parsed as YAML (secrets).
VERBATIM_ENV_KEYS = frozenset({"password", "api_key", "token"})
SECTION_GROUP = "opsloop.config_sections"
# Groups whose keys are registered sections: a key nobody registered is an error, not silently ignored.
SECTION_GROUPS = ("streams", "controllers")
# Old section name -> new one: still read, with a deprecation warning.
DEPRECATED_SECTIONS = {"controllers.detectors": "streams.detectors", "controllers.audit": "audit"}

log = logging.getLogger("opsloop.config")


class ConfigError(ValueError):
    """The configuration file is invalid; the message names the section, field and value."""


class _Section(NoBoolNumbers):
    # .inf and .nan are YAML floats: `collector.interval_s: .inf` passed and the collector died of OverflowError;
    # NoBoolNumbers: `kafka.partitions: true` was 1 partition
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _distinct_ports(section: BaseModel, names: tuple[str, ...]) -> None:
    """Two listeners of one section on one port: the second fails to bind while the first answers for it
    (a readiness probe on that port passes); refused here, naming both. Port 0 (off) never clashes."""
    seen: dict[int, str] = {}
    for name in names:
        port = getattr(section, name)
        if port and port in seen:
            raise ValueError(f"{seen[port]} and {name} are both {port} (each component needs its own port)")
        seen.setdefault(port, name)


class KafkaSettings(_Section):
    bootstrap_servers: str = f"{LOOPBACK}:29092"
    client_id: str = "opsloop"
    partitions: int = Field(default=4, ge=1, le=1024)  # for topics opsloop creates itself
    replication_factor: int = Field(default=1, ge=1, le=5)
    security: KafkaSecurity = Field(default_factory=KafkaSecurity)   # TLS / SASL: opsloop/kafka_security.py
    # Prepended to every topic, consumer group and the Faust app id (so its changelog topics too):
    # two deployments ("staging.", "prod.") share one cluster without seeing each other's records.
    topic_prefix: str = Field(default="", max_length=100, pattern=r"^[A-Za-z0-9._-]*$")

    def topic(self, name: str) -> str:
        """The topic as named on the cluster (``name`` is the base name: ``findings``, a Topic)."""
        return f"{self.topic_prefix}{name}"

    def group(self, group_id: str) -> str:
        """A consumer group id (or Faust app id) as named on the cluster."""
        return f"{self.topic_prefix}{group_id}"


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

    @model_validator(mode="after")
    def _ports(self) -> "StackSettings":
        _distinct_ports(self, ("kafka_port", "kafka_controller_port", "prometheus_port", "alertmanager_port"))
        return self


class StreamSettings(_Section):
    app_id: str = "opsloop-streams"
    data_dir: Path = DEFAULT_RUN_DIR / "streams"
    metrics_bind: str = LOOPBACK
    metrics_port: int = Field(default=29100, ge=0, le=65535)
    web_port: int = Field(default=29106, ge=1, le=65535)  # Faust's own web server, loopback only
    batch_size: int = Field(default=5000, ge=1, le=100_000)
    batch_within_s: float = Field(default=0.2, gt=0, le=10)
    # The window while an agent is behind by at least a batch (streams/runtime/take.py): larger
    # batches drain a backlog sooner (each touched state key is written once per batch).
    batch_backlog_within_s: float = Field(default=1.0, gt=0, le=10)
    producer_linger_s: float = Field(default=0.02, ge=0, le=1)
    # Longest a consumer fetch waits at the broker for data (Faust fixes 1500 ms, which stalls a
    # backlog whenever one partition is at its end: streams/runtime/transport.py).
    fetch_max_wait_ms: int = Field(default=100, ge=1, le=1500)
    log_level: str = "info"
    # How long Kafka waits for a dead worker before handing its partitions to another (Faust's
    # broker_session_timeout): low enough for a quick take-over after a crash.
    session_timeout_s: float = Field(default=10.0, ge=6, le=300)
    # A table recovery without progress for this long: re-seek at half, then exit for the supervisor
    # to restart the worker (streams/runtime/watchdog.py).
    recovery_stall_s: float = Field(default=8.0, ge=2, le=600)
    # How often the worker exports each held source partition's committed offset and uncommitted records
    # (streams/runtime/progress.py); well under OpsloopStreamPartitionStuck's 10 min.
    progress_interval_s: float = Field(default=15.0, ge=0.5, le=120)
    # A series silent for this long is dropped from the exported gauges (stale, not zero).
    series_ttl_s: float = Field(default=120.0, gt=0)
    # A sample stamped further ahead of the worker's clock than this is dead-lettered: a clock far
    # in the future would otherwise pin every series it touches (later samples look like replays).
    max_clock_skew_s: float = Field(default=300.0, gt=0)
    # Bound on the keys each stream handler keeps (hosts, series, servers); beyond it the least
    # recently seen are dropped and counted, as are keys silent for state_ttl_s.
    max_state_keys: int = Field(default=20_000, ge=1)
    state_ttl_s: float = Field(default=3600.0, gt=0)
    # Findings to Kafka (streams/agents/findings_sink.py): a batch waits at most this long for the broker
    # to acknowledge its findings (the agent waits meanwhile: an outage of the findings topic slows each
    # batch with findings by up to this); what is not acknowledged waits in an outbox, sent again at the
    # next batch and every findings_retry_interval_s, in order per finding; past findings_outbox_max
    # events the oldest are dropped, counted and logged.
    findings_delivery_timeout_s: float = Field(default=5.0, gt=0, le=30)
    findings_retry_interval_s: float = Field(default=5.0, ge=0.1, le=300)
    findings_outbox_max: int = Field(default=10_000, ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _ports(self) -> "StreamSettings":
        _distinct_ports(self, ("metrics_port", "web_port"))
        return self


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
    streams: dict[str, Any] = Field(default_factory=dict)
    controllers: dict[str, Any] = Field(default_factory=dict)
    audit: dict[str, Any] = Field(default_factory=dict)
    _warnings: list[str] = PrivateAttr(default_factory=list)

    def section(self, path: str) -> dict[str, Any]:
        """The raw mapping of a registered stage section (``"controllers.edge"``), ``{}`` when absent.

        Also finds a section given under its deprecated name (settings built in code, not by
        :func:`load_settings`, which moves them)."""
        for where in (path, *(old for old, new in DEPRECATED_SECTIONS.items() if new == path)):
            value = get_dotted(self.model_dump(include={where.split(".")[0]}), where)
            if value:
                return dict(value)
        return {}

    @property
    def warnings(self) -> list[str]:
        """Deprecation warnings from loading (old section names)."""
        return list(self._warnings)

    @field_validator("collectors")
    @classmethod
    def _known_collectors(cls, v: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, section in v.items():
            model = collector_config_model(name)
            try:
                out[name] = model.model_validate(section or {})
            except ValidationError as e:
                raise ValueError("; ".join(error_lines(e, prefix=f"collectors.{name}."))) from None
        return out


# A collector's name is a folder name: no dot (a key "netperf.__main__" imported, and so ran, a submodule).
_COLLECTOR_NAME = re.compile(r"[a-z][a-z0-9_]*")


def collector_names() -> list[str]:
    """The packages under collectors/ (folders with an __init__.py); collectors/telegraf is configuration only."""
    # looked up by name, not imported: the core finds the stage's plugins without depending on them
    spec = importlib.util.find_spec("opsloop.collectors")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return sorted(m.name for m in pkgutil.iter_modules(locations) if m.ispkg)


def collector_config_model(name: str) -> type[BaseModel]:
    """The ``Config`` model of collector ``name``; ValueError unless ``name`` is a collector's folder.

    ``name`` comes from the file or the environment: it is checked before anything is imported."""
    known = collector_names()
    if not isinstance(name, str) or not _COLLECTOR_NAME.fullmatch(name) or name not in known:
        raise ValueError(f"unknown collector {name!r} (known: {', '.join(known)})")
    try:
        mod = importlib.import_module(f"opsloop.collectors.{name}")
    except ModuleNotFoundError:
        raise ValueError(f"unknown collector {name!r} (no folder collectors/{name}/)") from None
    model = getattr(mod, "Config", None)
    if model is None:
        raise ValueError(f"collectors/{name} has no Config model")
    return model


def registered_sections() -> dict[str, type[BaseModel]]:
    """Section path -> its model, from the ``opsloop.config_sections`` entry points."""
    return {ep.name: ep.load() for ep in entry_points(group=SECTION_GROUP)}


def config_path(path: str | Path | None) -> Path | None:
    """The file to read: the given one, else ``$OPSLOOP_CONFIG``, else the default path if it exists."""
    if path is not None:
        return Path(path)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


def load_settings(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                  discover: bool = True) -> Settings:
    """Read and validate the whole config file, every section; the defaults when there is none.

    ``discover=False`` skips ``$OPSLOOP_CONFIG`` and the default path (the defaults, or ``path``)."""
    p = config_path(path) if discover else (Path(path) if path is not None else None)
    doc = read_document(p) if p is not None else {}
    doc = _deep_merge(doc, env_overrides(os.environ))
    if overrides:
        doc = _deep_merge(doc, overrides)
    where = f"config file {p}" if p else "configuration"
    doc, warnings = _migrate_deprecated(doc)
    errors = validation_errors(doc)
    if errors:
        raise ConfigError(f"{where}: {len(errors)} error{'s' if len(errors) > 1 else ''}:\n  " + "\n  ".join(errors))
    settings = Settings.model_validate(doc)
    for w in warnings:
        log.warning("%s: %s", where, w)   # services log it; `config check` shows it on stderr
    settings._warnings = warnings
    return settings


def read_document(p: Path) -> dict[str, Any]:
    """The config file's mapping, unvalidated; ConfigError in one line naming the file if unreadable."""
    try:
        loaded = read_yaml(p)
    except YamlFileError as e:
        raise ConfigError(f"config file {p}: {e}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {p}: top level must be a mapping, got {type(loaded).__name__}")
    return loaded or {}


def validation_errors(doc: dict[str, Any]) -> list[str]:
    """Every error of the document, one ``path: reason`` line each (empty when valid)."""
    errors: list[str] = []
    base = {k: v for k, v in doc.items() if k != "collectors"}
    try:
        errors += non_finite_lines(Settings.model_validate(base))
    except ValidationError as e:
        errors += error_lines(e)
    collectors = doc.get("collectors") or {}
    if not isinstance(collectors, dict):
        errors.append(f"collectors: must be a mapping of collector name to settings (got {type(collectors).__name__})")
        collectors = {}
    for name, section in collectors.items():
        try:
            model = collector_config_model(name)
        except ValueError as e:
            errors.append(f"collectors.{name}: {e}")
            continue
        try:
            errors += non_finite_lines(model.model_validate(section or {}), f"collectors.{name}")
        except ValidationError as e:
            errors += error_lines(e, prefix=f"collectors.{name}.")
    sections = registered_sections()
    for group in SECTION_GROUPS:
        given = doc.get(group) or {}
        if not isinstance(given, dict):
            continue   # reported by the base model
        known = sorted(n.split(".", 1)[1] for n in sections if n.startswith(f"{group}."))
        for name in given:
            if f"{group}.{name}" not in sections:
                errors.append(f"{group}.{name}: unknown section (known: {', '.join(known)})")
    for path, model in sections.items():
        section = get_dotted(doc, path)
        if section is None:
            continue
        try:
            errors += non_finite_lines(model.model_validate(section), path)
        except ValidationError as e:
            errors += error_lines(e, prefix=f"{path}.")
    if not errors:   # every section valid alone: the settings of one that must agree with another's
        for path, model in sections.items():
            check = getattr(model, "cross_section_errors", None)
            if check is not None and get_dotted(doc, path) is not None:
                errors += check(doc)
    return list(dict.fromkeys(errors))   # a stage's .inf is seen in the raw mapping and in its section


# The files a service reads at start: missing, it exits 78 (`opsloop config check` warns: it may run where the
# secrets are not, a CI job). Any other
# configured path may appear later (a log, a token file, a host's password file) or is made (state, *_dir).
READ_AT_START = frozenset({
    "kafka.security.password_file", "kafka.security.ssl_cafile", "kafka.security.ssl_certfile",
    "kafka.security.ssl_keyfile", "audit.elasticsearch.api_key_file", "audit.elasticsearch.password_file",
    "audit.elasticsearch.ca_file", "controllers.edge.topology_file", "collectors.ipmi.inventory",
    "collectors.keystone.probes.credentials_file"})
# resolved against the config file's directory by its service; other relative paths depend on the working
# directory the service is started in, which `config check` cannot know: they are not looked at
RELATIVE_TO_CONFIG = frozenset({"controllers.edge.topology_file"})


def path_problems(settings: Settings, config_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """``where: reason`` lines of the configured paths a service cannot use, as (errors, warnings). Errors: a
    setting named ``*_dir`` that is not a directory, any other path that is a directory; warnings: a file of
    :data:`READ_AT_START` missing here. Valid settings only (after :func:`load_settings`); loads no client
    library (the section models only)."""
    found: list[tuple[str, Path]] = []
    _paths(settings, "", found, 0)
    for section_path, model in sorted(registered_sections().items()):
        section = settings.section(section_path)
        if section:
            _paths(model.model_validate(section), section_path, found, 0)
    lines: list[str] = []
    missing: list[str] = []
    for where, path in found:
        if not path.is_absolute():
            if where not in RELATIVE_TO_CONFIG or config_dir is None:
                continue
            path = config_dir / path
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            if where in READ_AT_START:
                missing.append(f"{where}: {path}: no such file here (read at start: the service exits 78 without it)")
            continue
        except NotADirectoryError:
            lines.append(f"{where}: {path}: a part of it is a file, not a directory")
            continue
        except OSError:   # no permission here: the service's user may have it
            continue
        if where.rsplit(".", 1)[-1].endswith("_dir"):
            if not stat.S_ISDIR(mode):
                lines.append(f"{where}: {path} is not a directory")
        elif stat.S_ISDIR(mode):
            lines.append(f"{where}: {path} is a directory, expected a file")
    return lines, missing


def _paths(value: Any, where: str, out: list[tuple[str, Path]], depth: int) -> None:
    """Every Path in ``value`` (validated settings: models, lists, mappings) with its dotted place."""
    if isinstance(value, Path):
        out.append((where, value))
        return
    items = _settings_items(value)
    if items is None or depth > 50:
        return
    for key, item in items:
        _paths(item, f"{where}.{key}" if where else str(key), out, depth + 1)


def _settings_items(value: Any) -> Any:
    """(key, item) of a validated settings value's children (a model's fields, a mapping, a list), or None
    for a leaf."""
    if isinstance(value, BaseModel):
        return ((name, getattr(value, name, None)) for name in type(value).model_fields)
    if isinstance(value, dict):
        return value.items()
    if isinstance(value, (list, tuple)):
        return enumerate(value)
    return None


def non_finite_lines(value: Any, where: str = "", depth: int = 0) -> list[str]:
    """A ``where.key: ...`` line per NaN or infinite float in a validated section (its nested models, lists
    and mappings too). Every section model refuses them, whatever its own base: the models of the core,
    collectors, detectors, paging, actuator and audit set ``allow_inf_nan=False`` themselves
    (tests/core/test_settings_models_finite.py), the edge controller's not yet, and a string "inf" becomes
    a float only once validated."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"{where}: Input should be a finite number (got {value!r})"]
    items = _settings_items(value)
    if items is None or depth > 50:   # settings are a few levels deep; deeper free-form mappings: their model
        return []
    lines: list[str] = []
    for key, item in items:
        lines += non_finite_lines(item, f"{where}.{key}" if where else str(key), depth + 1)
    return lines


def defaults_document() -> dict[str, Any]:
    """Every setting with its default, stage sections included (a required setting shows as ``null``)."""
    doc = Settings().model_dump(mode="json")
    for path, model in sorted(registered_sections().items()):
        node = doc
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _model_defaults(model)
    return doc


def _model_defaults(model: type[BaseModel]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.is_required():
            out[name] = None
            continue
        value = field.get_default(call_default_factory=True)
        out[name] = value.model_dump(mode="json") if isinstance(value, BaseModel) else _jsonable(value)
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def env_overrides(environ: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    """``OPSLOOP__A__B=value`` -> ``{"a": {"b": value}}``; the value is read as a YAML scalar or list."""
    doc: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or len(key) == len(ENV_PREFIX):
            continue
        parts = [part.lower() for part in key[len(ENV_PREFIX):].split("__")]
        if parts[-1] in VERBATIM_ENV_KEYS:
            value: Any = raw   # a secret is a string as given: YAML would turn "0x1f" into 31, "yes" into true
        else:
            try:   # the shared parser: its alias and size bounds; a key given twice is refused
                value = parse_yaml(raw) if raw.strip() else raw
            except YamlFileError as e:
                if not e.not_yaml:   # YAML, but unusable: said, not taken as a string
                    raise ConfigError(f"environment {key}: {e.bare}") from None
                value = raw   # not YAML: the string as given
        node = doc
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment {key}: {'.'.join(parts[:-1])} is set as a value and a section")
        node[parts[-1]] = value
    return doc


def _migrate_deprecated(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    warnings = []
    for old, new in DEPRECATED_SECTIONS.items():
        value = get_dotted(doc, old)
        if value is None:
            continue
        if get_dotted(doc, new) is not None:
            raise ConfigError(f"both {old} (the old name) and {new} are set: keep only {new}")
        old_group, old_name = old.split(".", 1)
        doc = {**doc, old_group: {k: v for k, v in doc[old_group].items() if k != old_name}}
        doc = _deep_merge(doc, _nest(new, value))
        warnings.append(f"section {old} is deprecated: rename it to {new}")
    return doc, warnings


def _nest(path: str, value: Any) -> dict[str, Any]:
    for part in reversed(path.split(".")):
        value = {part: value}
    return value


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
