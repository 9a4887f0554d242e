"""The telemetry sample (``telemetry.*`` topics): one metric in Telegraf's JSON serializer shape.

    {"name": "ipmi_power", "tags": {"host": "stor-g3-17", "source": "dcmi"},
     "fields": {"watts": 155.0}, "timestamp": 1795310400}

Records on the telemetry topics carry one sample or a batch of them (:mod:`opsloop.wire` parses and
encodes those); this module is the sample's schema and its bounds.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opsloop.topics import Topic, series_key, topic_for
from opsloop.validation import WireError, describe_validation_error

# Plausible event time range (seconds since the epoch). A value above the upper bound is almost
# always a millisecond or nanosecond timestamp from a misconfigured Telegraf
# (json_timestamp_units), and we say so instead of storing samples in the year 57000.
MIN_TIMESTAMP = 946684800  # 2000-01-01
MAX_TIMESTAMP = 4102444800  # 2100-01-01

MAX_NAME_LEN = 200
MAX_TAGS = 64
MAX_FIELDS = 256


# Finite floats are enforced in pydantic's core (no Python validator on the hot path).
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# Telegraf's integer fields are int64 or uint64 (the line protocol's i and u): an integer beyond them
# is no measurement, and beyond a float's range (JSON takes 10**400) float() raised in every handler
FieldInt = Annotated[int, Field(ge=-(2 ** 63), le=2 ** 64 - 1)]
FieldValue = FiniteFloat | FieldInt | bool | str


class Metric(BaseModel):
    """One sample in Telegraf's JSON shape. Timestamps are event time, seconds since the epoch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_LEN, pattern=r"^[A-Za-z_][A-Za-z0-9_.:\-]*$")
    tags: dict[str, str] = Field(default_factory=dict, max_length=MAX_TAGS)
    fields: dict[str, FieldValue] = Field(min_length=1, max_length=MAX_FIELDS)
    # Seconds since the epoch, 2000..2100; describe_validation_error explains values out of range. A number: lax
    # mode took digits in a string ("1795310400") as one; an int is a float here, as Telegraf writes it.
    timestamp: float = Field(strict=True, ge=MIN_TIMESTAMP, le=MAX_TIMESTAMP)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tags": self.tags, "fields": self.fields, "timestamp": self.timestamp}

    @property
    def topic(self) -> Topic:
        return topic_for(self.name, self.tags)

    @property
    def key(self) -> str:
        return series_key(self.name, self.tags)


def metric(name: str, fields: Mapping[str, FieldValue], tags: Mapping[str, str] | None = None,
           timestamp: float | None = None) -> Metric:
    """Build a validated sample (raises WireError naming what was wrong)."""
    try:
        return Metric(name=name, tags=dict(tags or {}), fields=dict(fields),
                      timestamp=time.time() if timestamp is None else timestamp)
    except ValidationError as e:
        raise WireError(describe_validation_error(e)) from None
