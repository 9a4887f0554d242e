"""Pydantic validation errors as lines an operator can act on: one error per line, with its full path.

``controllers.edge.interval_s: Input should be a valid number (got 'banana')`` — the path from the top of
the file (or record), the reason, and the offending value cut to a readable length (never the whole dict
it sits in).
"""

from __future__ import annotations

import math
import types
import typing
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ValidationError, ValidationInfo, field_validator

from opsloop.redact import names_a_secret, redact_credentials

MAX_SHOWN = 80
# 9999-12-31T23:59:59Z: the last time a four-digit year (RFC 3339, ISO 8601) can say, in s and in ms. A saved
# or recovered time beyond it (or before 1970) is damage: it loaded, and then every step that formatted or
# out-stamped it failed (paging's state, the actuators' history, the edge controller's recovered epoch)
LAST_TIME_S = 253_402_300_799.0
LAST_TIME_MS = 253_402_300_799_999


def is_time(value: object) -> bool:
    """``value`` is a time in seconds a record or a saved state may carry: a number from 1970 to the end of
    9999 (not a bool; NaN and infinities fail the range)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= LAST_TIME_S


class WireError(ValueError):
    """Input that does not follow the wire format or a record's schema. The message names field and value."""


def check_number(field: str, value: Any, *, allow_inf: bool = False, maximum: float = math.inf) -> float:
    """``value`` as a float when it is a finite number in ``[0, maximum]`` (``inf`` too when
    ``allow_inf``); else ValueError naming ``field`` and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field}: expected a number, got {value!r}")
    v = float(value)
    if math.isnan(v) or v < 0 or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{field}: expected a finite number >= 0, got {value!r}")
    if math.isfinite(v) and v > maximum:
        raise ValueError(f"{field}: {value!r} is above the largest accepted value {maximum:g}")
    return v


BOOL_FOR_NUMBER = "expected a number, not a boolean (YAML reads unquoted yes/no/on/off as true/false)"


def refuse_bool(value: Any) -> Any:
    """``value`` unless it is a boolean: pydantic reads ``true`` as 1 where a number is meant."""
    if isinstance(value, bool):
        raise ValueError(BOOL_FOR_NUMBER)
    return value


# Numbers never booleans, for where NoBoolNumbers does not look: inside a mapping or list of a model, or a
# model that is not a NoBoolNumbers (`latency_ms: {ams: {near: yes}}` was 1 ms)
FloatNotBool = Annotated[float, BeforeValidator(refuse_bool)]
IntNotBool = Annotated[int, BeforeValidator(refuse_bool)]
NumberNotBool = Annotated[float | int, BeforeValidator(refuse_bool)]


def _means_number(annotation: Any) -> bool:
    """A field's type is a number (``float``, ``int | None``, ``Annotated[float, ...]``), not also a boolean."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a
                   for a in typing.get_args(annotation)]
        return bool not in members and any(m in (int, float) for m in members)
    return annotation in (int, float)


class NoBoolNumbers(BaseModel):
    """A settings model whose numbers are never booleans: pydantic reads ``true`` as 1 (``max_step: true``,
    an unquoted ``on``/``yes`` were a step of 100 %), so a number field refuses one with its path."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        return refuse_bool(value) if field is not None and _means_number(field.annotation) else value


def shown(value: object) -> str:
    """``repr`` of an offending value, cut to :data:`MAX_SHOWN` characters."""
    text = redact_credentials(repr(value))   # a URL's user:password@ never reaches the output
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


# A setting named like a secret never has its value shown (its *_file path may be): a numeric password
# (`password: 12345678`, read by YAML as an int) or a secret put where its variable's name goes was
# printed whole after "got".
def _secret_setting(loc: tuple[Any, ...]) -> bool:
    name = next((str(p).lower() for p in reversed(loc) if isinstance(p, str)), "")
    return names_a_secret(name) and not name.endswith("_file")


def is_secret_setting(name: str) -> bool:
    """A setting named like a secret (``password``, ``api_key``, ``token``...), not the path of a file holding
    one (``*_file``) nor the name of a variable holding one (``*_env``)."""
    lowered = name.lower()
    return names_a_secret(lowered) and not lowered.endswith(("_file", "_env"))


def error_lines(e: ValidationError, prefix: str = "") -> list[str]:
    """One ``path: reason (got value)`` line per error; ``prefix`` is the section's path (``"a.b."``)."""
    lines = []
    for err in e.errors(include_url=False):
        loc = _path(err)
        where = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "(top level)")
        # A validator's own message may quote the value: no user:password@ of a URL in it either.
        msg = redact_credentials(str(err.get("msg", "invalid")).removeprefix("Value error, "))
        if err.get("type") == "extra_forbidden":
            lines.append(f"{where}: unknown setting")
        elif err.get("type") == "missing":
            lines.append(f"{where}: required setting missing")
        elif isinstance(err.get("input"), dict) and err.get("type", "").startswith("value_error"):
            lines.append(f"{where}: {msg}")   # a model-level check: its message names the fields
        elif _secret_setting(err.get("loc", ())):
            lines.append(f"{where}: {msg} (value not shown: a secret setting)")
        else:
            lines.append(f"{where}: {msg} (got {shown(err.get('input'))})")
    return lines


# Bounds of describe_validation_error: a 0.25 MB record with 20,000 bad fields gave an 80,000-error,
# 5 MB line (a dead letter beyond Kafka's 1 MB) that took seconds to build.
MAX_DESCRIBED_ERRORS = 10
MAX_ERROR_PART = 400   # one error's line: a 100 kB field name is its path


def _path(err: Any) -> str:
    """An error's path, dotted. A mapping's key is a part of it: a long one (a host name of 5000 characters) is
    shortened, so the cut of the line leaves the reason readable; masked first (a cut inside user:password@
    would leave the password unmasked)."""
    return ".".join(_short(redact_credentials(str(p))) for p in err.get("loc", ()))


def _short(part: str, keep: int = 40) -> str:
    return part if len(part) <= keep + 20 else f"{part[:keep]}...({len(part)} chars)"


def describe_validation_error(e: ValidationError, prefix: str = "") -> str:
    """The errors on one line (a dead-letter reason, an exception message): ``path: reason (got value)``
    joined by ``; ``, with what a timestamp out of range most likely means. The first
    :data:`MAX_DESCRIBED_ERRORS` only, each cut to :data:`MAX_ERROR_PART` characters, then
    ``and K more errors``."""
    parts = []
    errors = e.errors(include_url=False)
    for err in errors[:MAX_DESCRIBED_ERRORS]:
        loc = _path(err)
        where = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "record")
        got = redact_credentials(repr(err.get("input")))   # masked before the cut below
        if len(got) > 80:
            got = got[:77] + "..."
        if _secret_setting(err.get("loc", ())):
            got = "value not shown: a secret setting"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")   # pydantic's, not the reason
        if loc.endswith("timestamp") and err.get("type") == "less_than_equal":
            msg = ("timestamp is after 2100: looks like milliseconds or nanoseconds; expected seconds "
                   "(Telegraf: json_timestamp_units = \"1s\")")
        elif loc.endswith("timestamp") and err.get("type") == "greater_than_equal":
            msg = "timestamp is before 2000; expected seconds since the epoch"
        elif err.get("type") == "finite_number":
            msg = "not a finite number"
        if isinstance(err.get("input"), dict) and err.get("type", "").startswith("value_error"):
            part = f"{where}: {msg}"   # a check across fields: its message names them, not the mapping
        else:
            part = f"{where}: {msg} (got {got})"
        # A config value or a validator's message may quote a URL: its user:password@ never reaches the
        # output (masked before the cut, which could leave a password without its "@")
        part = redact_credentials(part)
        parts.append(part if len(part) <= MAX_ERROR_PART else part[:MAX_ERROR_PART - 3] + "...")
    if len(errors) > MAX_DESCRIBED_ERRORS:
        parts.append(f"and {len(errors) - MAX_DESCRIBED_ERRORS} more errors")
    return "; ".join(parts)


def yaml_error_line(e: yaml.YAMLError) -> str:
    """One line: where and what, never the text around it. PyYAML's own message quotes the offending
    line of the file under a caret, over several lines: a secret with a stray quote was printed whole."""
    mark = getattr(e, "problem_mark", None)
    # PyYAML quotes a tag in its problem ("... for the tag '!xxx...'"): a 100 kB tag was a 100 kB line
    problem = _cut(getattr(e, "problem", None) or type(e).__name__)
    context, cmark = _cut(getattr(e, "context", None)), getattr(e, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if context and cmark is not None:
        context += f" from line {cmark.line + 1}, column {cmark.column + 1}"
    return f"{where}{problem}" + (f" ({context})" if context else "")


MAX_YAML_BYTES = 16 * 2 ** 20
MAX_YAML_VALUES = 1_000_000   # with every alias expanded: a file of settings has thousands


def _cut(text: str | None, limit: int = 200) -> str | None:
    return text if text is None or len(text) <= limit else text[:limit - 3] + "..."


class YamlFileError(ValueError):
    """A YAML file that cannot be used: unreadable, not UTF-8 text or not YAML. The message is one line
    without the file's name: the caller names the file as its users know it (config file, topology file).
    ``bare`` is the same line with nothing of the file's content (no byte, no quoted tag): for a file of
    secrets (credentials)."""

    def __init__(self, message: str, bare: str | None = None, *, not_yaml: bool = False) -> None:
        super().__init__(message)
        self.bare = bare or message
        self.not_yaml = not_yaml   # the text is not YAML at all (a syntax error), not merely unusable YAML


def read_yaml(path: Path) -> Any:
    """The parsed YAML document of ``path`` (anything YAML gives: the caller checks its shape); the one
    reader of every YAML file a user hands a command, so each refuses a bad one in the same one line."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)   # bounded: /dev/zero given as a file was read until memory ran out
    except OSError as e:   # missing, a directory, no permission
        raise YamlFileError(f"cannot read ({e.strerror or type(e).__name__})") from None
    if len(data) > MAX_YAML_BYTES:
        raise YamlFileError(f"larger than {MAX_YAML_BYTES // 2 ** 20} MiB: not a file of settings")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:   # a latin-1 comment, a UTF-16 file: was a traceback
        raise YamlFileError(f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})",
                            f"not UTF-8 text (at byte offset {e.start})") from None
    return parse_yaml(text)


def parse_yaml(text: str) -> Any:
    """The parsed YAML document of ``text`` with :func:`read_yaml`'s limits (size, depth, aliases) and its
    one-line errors: for YAML that does not come from a file (a command's output)."""
    if len(text) > MAX_YAML_BYTES:
        raise YamlFileError(f"larger than {MAX_YAML_BYTES // 2 ** 20} MiB: not a file of settings")
    try:
        doc = _safe_load_unique(text)
        values = expanded_values(doc)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise YamlFileError(f"not valid YAML: {yaml_error_line(e)}",
                            "not valid YAML" + (f" at line {mark.line + 1}" if mark is not None else ""),
                            not_yaml=True) from None
    except RecursionError:   # PyYAML builds nested collections recursively: '[' * 1000 was a traceback
        raise YamlFileError("not usable YAML: nested too deeply") from None
    if values > MAX_YAML_VALUES:   # aliases of aliases: 9 levels of 9 are 387 million values to validate
        raise YamlFileError(f"not usable YAML: its aliases expand to more than {MAX_YAML_VALUES:,} values")
    return doc


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _safe_load_unique(text: str) -> Any:
    """``yaml.safe_load(text)``, but a mapping with a key given twice is a YamlFileError: PyYAML keeps the
    last silently (a second ``capacity:`` of an origin, a second ``events:`` list replaced the first)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(loader, node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _refuse_duplicate_keys(loader: yaml.SafeLoader, root: yaml.Node) -> None:
    """YamlFileError naming the first (by line) mapping key given twice, with its path and both lines.
    Keys compare as YAML reads them (``1`` and ``01``, ``yes`` and ``true`` are one key to PyYAML too);
    a merge (``<<: *base``) overrides by design. Each node once: an alias shares its node."""
    found: list[tuple[int, int, str, str]] = []
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, where = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        children: list[tuple[yaml.Node, str]] = []
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_TAG:
                    children.append((value, where))
                    continue
                name = _short(redact_credentials(key.value))
                line = key.start_mark.line + 1
                ident = loader.construct_object(key)   # as the mapping will hold it
                if ident in first:
                    found.append((line, key.start_mark.column,
                                  f"{where}{name}: given twice (lines {first[ident]} and {line}); "
                                  "YAML keeps only the last",
                                  f"a key given twice (lines {first[ident]} and {line})"))
                first.setdefault(ident, line)
                children.append((value, f"{where}{name}."))
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, f"{where}{i}.") for i, item in enumerate(node.value)]
        stack.extend(reversed(children))   # in the file's order: a shared node is named where it is written
    if found:
        _, _, message, bare = min(found)
        raise YamlFileError(message, bare)


def expanded_values(doc: Any) -> int:
    """How many values ``doc`` holds with every alias expanded, counted without expanding them (each
    collection once: its size is remembered); YamlFileError for a collection that contains itself."""
    sizes: dict[int, int] = {}
    active: set[int] = set()   # the collections being counted: one met again inside itself is a cycle

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in active:
            raise YamlFileError("not usable YAML: an alias refers to a collection that contains it")
        active.add(id(node))
        items = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        total = 1
        for item in items:
            total += size(item)
            if total > MAX_YAML_VALUES:
                break
        active.discard(id(node))
        sizes[id(node)] = total
        return total

    return size(doc)
