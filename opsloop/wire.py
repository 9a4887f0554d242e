"""The wire format every stage speaks: Telegraf's JSON serializer shape, versioned.

One sample::

    {"name": "ipmi_power", "tags": {"host": "stor-g3-17", "source": "dcmi"},
     "fields": {"watts": 155.0}, "timestamp": 1795310400}

A Kafka record carries either one sample (what Telegraf writes with ``json`` and batch
format off) or a batch ``{"schema_version": 1, "metrics": [sample, ...]}`` (Telegraf's batch
shape plus our version field). Collectors send one batch per series key and round: the stream
stage's cost is per message, not per sample (a naive Faust agent costs about 50 times a plain
consumer loop per message), so fewer, larger messages are the main performance lever.

Parsing never raises for a bad *sample* inside a good batch: :func:`parse_record` returns the
good samples and one :class:`Rejected` per bad one, so a dead-letter record can be written for
exactly what was wrong and nothing good is lost.
"""

from __future__ import annotations

import base64
import enum
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Iterable, Mapping

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from opsloop.redact import redact_credentials

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

# Plausible event time range (seconds since the epoch). A value above the upper bound is almost
# always a millisecond or nanosecond timestamp from a misconfigured Telegraf
# (json_timestamp_units), and we say so instead of storing samples in the year 57000.
MIN_TIMESTAMP = 946684800  # 2000-01-01
MAX_TIMESTAMP = 4102444800  # 2100-01-01

MAX_NAME_LEN = 200
MAX_TAGS = 64
MAX_FIELDS = 256
DEADLETTER_VALUE_LIMIT = 64 * 1024


class Topic(str, enum.Enum):
    """Kafka topics. Telemetry per signal family; derived topics for findings and decisions."""

    IPMI = "telemetry.ipmi"
    NETPERF = "telemetry.netperf"
    KEYSTONE = "telemetry.keystone"
    IPTABLES = "telemetry.iptables"
    LB = "telemetry.lb"
    DEADLETTER = "telemetry.deadletter"
    FINDINGS = "findings"
    EDGE_DEMAND = "edge.demand"
    EDGE_WEIGHTS = "edge.weights"
    AUDIT = "audit"

    def __str__(self) -> str:  # so f"{Topic.LB}" is the topic name
        return self.value


TELEMETRY_TOPICS: tuple[Topic, ...] = (Topic.IPMI, Topic.NETPERF, Topic.KEYSTONE, Topic.IPTABLES, Topic.LB)

# Metric name prefix -> topic. Covers our collectors and Telegraf's input names
# (ipmi_sensor, iptables, ipvs_*, haproxy).
_PREFIX_TOPIC: tuple[tuple[str, Topic], ...] = (
    ("ipmi", Topic.IPMI),
    ("power", Topic.IPMI),
    ("netperf", Topic.NETPERF),
    ("iperf", Topic.NETPERF),
    ("keystone", Topic.KEYSTONE),
    ("uwsgi", Topic.KEYSTONE),
    ("s3_frontend", Topic.KEYSTONE),
    ("iptables", Topic.IPTABLES),
    ("firewall", Topic.IPTABLES),
    ("haproxy", Topic.LB),
    ("ipvs", Topic.LB),
    ("lvs", Topic.LB),
    ("lb_", Topic.LB),
    ("edge_", Topic.LB),
)

# Tag that overrides routing (Telegraf: set it in [inputs.X.tags] and use it as outputs.kafka topic_tag).
TOPIC_TAG = "opsloop_topic"
# Tags that identify the series' source, in order of preference, for the record key.
KEY_TAGS = ("host", "edge", "server", "hypervisor", "target_set", "instance")


class WireError(ValueError):
    """A record or sample that does not follow the wire format. The message names field and value."""


# Finite floats are enforced in pydantic's core (no Python validator on the hot path).
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
FieldValue = FiniteFloat | int | bool | str


class Metric(BaseModel):
    """One sample in Telegraf's JSON shape. Timestamps are event time, seconds since the epoch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_LEN, pattern=r"^[A-Za-z_][A-Za-z0-9_.:\-]*$")
    tags: dict[str, str] = Field(default_factory=dict, max_length=MAX_TAGS)
    fields: dict[str, FieldValue] = Field(min_length=1, max_length=MAX_FIELDS)
    # Seconds since the epoch, 2000..2100; describe_validation_error explains values out of range.
    timestamp: float = Field(ge=MIN_TIMESTAMP, le=MAX_TIMESTAMP)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tags": self.tags, "fields": self.fields, "timestamp": self.timestamp}

    @property
    def topic(self) -> Topic:
        return topic_for(self.name, self.tags)

    @property
    def key(self) -> str:
        return series_key(self.name, self.tags)


_BATCH: TypeAdapter[list[Metric]] = TypeAdapter(list[Metric])


def metric(name: str, fields: Mapping[str, FieldValue], tags: Mapping[str, str] | None = None,
           timestamp: float | None = None) -> Metric:
    """Build a validated sample (raises WireError naming what was wrong)."""
    try:
        return Metric(name=name, tags=dict(tags or {}), fields=dict(fields),
                      timestamp=time.time() if timestamp is None else timestamp)
    except ValidationError as e:
        raise WireError(describe_validation_error(e)) from None


def topic_for(name: str, tags: Mapping[str, str]) -> Topic:
    explicit = tags.get(TOPIC_TAG)
    if explicit:
        try:
            return Topic(explicit)
        except ValueError:
            raise WireError(f"tag {TOPIC_TAG}={explicit!r} is not a known topic") from None
    for prefix, topic in _PREFIX_TOPIC:
        if name.startswith(prefix):
            return topic
    raise WireError(f"name {name!r} maps to no telemetry topic (set tag {TOPIC_TAG})")


def series_key(name: str, tags: Mapping[str, str]) -> str:
    """Kafka key: the source of the series, so one series always lands in one partition."""
    for t in KEY_TAGS:
        v = tags.get(t)
        if v:
            return v
    return name


_LABEL_ESCAPES = str.maketrans({"\\": "\\\\", ",": "\\,", "=": "\\=", "|": "\\|"})


def label_string(labels: Mapping[str, str], skip: Iterable[str] = ()) -> str:
    """``k=v`` pairs in key order joined by ``,``, with ``\\ , = |`` escaped by a backslash.

    Unambiguous (``{"host": "a,port=1"}`` and ``{"host": "a", "port": "1"}`` differ) and, for
    values without those characters, the same text as the plain join: ids built from it stay put."""
    skipped = frozenset(skip)
    items = [(k, v) for k, v in sorted(labels.items()) if k not in skipped]
    # Fast path (labels without those characters, nearly all): the plain join, recognised as such by
    # its separator counts. It is on the hot path of every finding book lookup.
    plain = ",".join(["%s=%s" % kv for kv in items])   # %s is str(), as below
    if (plain.count(",") == len(items) - 1 and plain.count("=") == len(items) and "\\" not in plain
            and "|" not in plain):
        return plain
    return ",".join(f"{str(k).translate(_LABEL_ESCAPES)}={str(v).translate(_LABEL_ESCAPES)}" for k, v in items)


def describe_validation_error(e: ValidationError, prefix: str = "") -> str:
    parts = []
    for err in e.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()))
        where = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "record")
        value = err.get("input")
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        msg = err.get("msg")
        if loc.endswith("timestamp") and err.get("type") == "less_than_equal":
            msg = ("timestamp is after 2100: looks like milliseconds or nanoseconds; expected seconds "
                   "(Telegraf: json_timestamp_units = \"1s\")")
        elif loc.endswith("timestamp") and err.get("type") == "greater_than_equal":
            msg = "timestamp is before 2000; expected seconds since the epoch"
        elif err.get("type") == "finite_number":
            msg = "not a finite number"
        parts.append(f"{where}: {msg} (got {shown})")
    # A config value or a validator's message may quote a URL: its user:password@ never reaches the output.
    return redact_credentials("; ".join(parts))


@dataclass(slots=True)
class Rejected:
    """A sample (or whole record) that failed validation, with the reason and its raw form."""

    reason: str
    raw: Any = None
    index: int | None = None


@dataclass(slots=True)
class Parsed:
    metrics: list[Metric] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    batch: bool = False   # the record was a batch (samples are named metrics.<i>.)


_BATCH_KEYS = frozenset({"metrics", "schema_version"})


def parse_record(raw: bytes | str) -> Parsed:
    """Parse one Kafka record value: a sample or a batch. Bad samples are returned as Rejected."""
    if isinstance(raw, str):
        raw = raw.encode()
    if not raw:
        return Parsed(rejected=[Rejected("empty record")])
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return Parsed(rejected=[Rejected(f"not JSON: {e}", _preview(raw))])
    return parse_document(doc)


def parse_document(doc: Any) -> Parsed:
    if not isinstance(doc, dict):
        return Parsed(rejected=[Rejected(f"record is a JSON {type(doc).__name__}, expected an object", doc)])
    if "metrics" in doc:
        version = doc.get("schema_version", SCHEMA_VERSION)
        unknown = set(doc) - _BATCH_KEYS
        if unknown:
            return Parsed(rejected=[Rejected(f"batch has unknown keys {sorted(unknown)}", doc)])
        if version not in SUPPORTED_SCHEMA_VERSIONS:
            return Parsed(rejected=[Rejected(f"schema_version: {version!r} is not supported "
                                             f"(supported: {sorted(SUPPORTED_SCHEMA_VERSIONS)})", doc)])
        items = doc["metrics"]
        if not isinstance(items, list):
            return Parsed(rejected=[Rejected(f"metrics: expected a list (got {type(items).__name__})", doc)])
        # Fast path: the whole batch in one call into pydantic-core; per sample only when it fails.
        try:
            return Parsed(metrics=_BATCH.validate_python(items), schema_version=version, batch=True)
        except ValidationError:
            pass
        out = Parsed(schema_version=version, batch=True)
        for i, item in enumerate(items):
            _validate_into(item, out, index=i, prefix=f"metrics.{i}.")
        return out
    out = Parsed()
    _validate_into(doc, out, index=None, prefix="")
    return out


def _validate_into(item: Any, out: Parsed, index: int | None, prefix: str) -> None:
    try:
        out.metrics.append(Metric.model_validate(item))
    except ValidationError as e:
        out.rejected.append(Rejected(describe_validation_error(e, prefix), item, index))


def encode_batch(metrics: Iterable[Metric]) -> bytes:
    return orjson.dumps({"schema_version": SCHEMA_VERSION, "metrics": [m.to_dict() for m in metrics]})


def group_by_route(metrics: Iterable[Metric]) -> dict[tuple[Topic, str], list[Metric]]:
    """Group samples by (topic, key), keeping their order, for one message per group."""
    groups: dict[tuple[Topic, str], list[Metric]] = {}
    for m in metrics:
        groups.setdefault((m.topic, m.key), []).append(m)
    return groups


def _preview(raw: bytes, limit: int = 200) -> str:
    text = raw[:limit].decode("utf-8", "backslashreplace")
    return text + ("..." if len(raw) > limit else "")


def deadletter_record(reason: str, *, topic: str, partition: int | None = None, offset: int | None = None,
                      key: bytes | None = None, value: Any = None, stage: str = "stream") -> bytes:
    """The dead-letter record: why, where it came from, and the offending input (bounded)."""
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "reason": reason,
        "stage": stage,
        "source_topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key,
        "received_at": time.time(),
    }
    if isinstance(value, bytes):
        try:
            doc["value"] = value[:DEADLETTER_VALUE_LIMIT].decode("utf-8")
        except UnicodeDecodeError:
            doc["value_b64"] = base64.b64encode(value[:DEADLETTER_VALUE_LIMIT]).decode()
        doc["truncated"] = len(value) > DEADLETTER_VALUE_LIMIT
    else:
        doc["value"] = value
    return orjson.dumps(doc, default=str)
