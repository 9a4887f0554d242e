"""The base of every topic's record: JSON on the wire (orjson), validated by pydantic, versioned.

A record class names itself (``RECORD``, used in every error message) and, when its key is derived
from its content, its ``id`` (``ENCODE_ID``: written beside the fields, dropped again on decode). Decoding
never lets a raw pydantic or JSON error out: :class:`RecordError` names the record, the field and the
value, so a consumer can dead-letter the record with a reason an operator can act on.

The records' numbers and flags are typed strictly (:data:`Integer`, :data:`Number`, :data:`Flag`): pydantic's lax
mode read JSON ``true`` as 1 and ``"12"`` as 12, so ``"first_seen": true`` decoded as a finding of 1970 and
``"version": true`` as version 1. What producers send stays accepted: an int where a float goes, an integral
float (``12.0``) where an int goes.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, TypeVar

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError, PydanticKnownError

from opsloop.validation import WireError, describe_validation_error

R = TypeVar("R", bound="JsonRecord")


def _integer(value: Any) -> Any:
    # before pydantic's lax int, which took a bool (true: 1) and digits ("12": 12) as integers; its strict int
    # would refuse 12.0 and numpy's ints too, which producers may pass
    if isinstance(value, (bool, str, bytes, bytearray)):
        raise PydanticKnownError("int_type")
    return value


# An integer field: no bool, no text; an integral float (12.0) is taken as before.
Integer = Annotated[int, BeforeValidator(_integer)]
# A number field: an int or a float (numpy's too), no bool, no text (pydantic's strict float, in its core).
Number = Annotated[float, Field(strict=True)]
# A flag: JSON true or false only (lax read 1, "yes", "off" as flags).
Flag = Annotated[bool, Field(strict=True)]


def no_bool(expected: str) -> BeforeValidator:
    """A validator refusing a bool, for a field of a union a bool would pass as a number (``float | str``,
    ``int | str``): one error naming the field and ``expected``, not one per member of the union."""
    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise PydanticCustomError("bool_refused", "Input should be {expected}", {"expected": expected})
        return value
    return BeforeValidator(check)


class RecordError(WireError):
    """A record of a derived topic (demand, weights, findings, audit) that cannot be decoded or built."""


def load_object(raw: bytes | str | None, what: str, error: type[RecordError] = RecordError) -> dict[str, Any]:
    """``raw`` parsed as a JSON object, else :class:`RecordError` saying what it was instead."""
    if not raw:   # a tombstone or an empty value
        raise error(f"{what}: empty record")
    try:
        doc: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise error(f"{what}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise error(f"{what}: expected a JSON object, got {type(doc).__name__}")
    return doc


class JsonRecord(BaseModel):
    """One record of a derived topic. Subclasses declare fields; encode/decode are shared."""

    model_config = ConfigDict(extra="forbid")

    RECORD: ClassVar[str] = "record"
    ENCODE_ID: ClassVar[bool] = False
    ERROR: ClassVar[type[RecordError]] = RecordError
    SCHEMA_VERSION: ClassVar[int] = 1

    schema_version: Integer = 1

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, value: int) -> int:
        if value != cls.SCHEMA_VERSION:
            raise ValueError(f"schema_version: unsupported version {value!r} (know {cls.SCHEMA_VERSION})")
        return value

    @property
    def id(self) -> str:  # overridden by records whose key comes from their content
        raise NotImplementedError

    def to_json_dict(self) -> dict[str, Any]:
        doc = self.model_dump(mode="json")
        if self.ENCODE_ID:
            doc["id"] = self.id
        return doc

    def encode(self) -> bytes:
        return orjson.dumps(self.to_json_dict())

    @classmethod
    def decode(cls: type[R], raw: bytes | str | None) -> R:
        doc = load_object(raw, cls.RECORD, cls.ERROR)
        if cls.ENCODE_ID:
            doc.pop("id", None)
        return cls.build(**doc)

    @classmethod
    def build(cls: type[R], **fields: Any) -> R:
        """A validated record; :class:`RecordError` naming what was wrong."""
        try:
            return cls(**fields)
        except ValidationError as e:
            raise cls.ERROR(f"{cls.RECORD}: {describe_validation_error(e)}") from None
        except TypeError as e:   # a field name that is not a string
            raise cls.ERROR(f"{cls.RECORD}: {e}") from None
