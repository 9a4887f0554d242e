"""`opsloop deadletter`: read the dead-letter topic, count what was refused, and send records back.

Every stage that refuses a record writes a dead letter to ``telemetry.deadletter`` (``kafka.topic_prefix``
applied): why, which stage, where the record came from and its bytes, bounded (opsloop/records/deadletter.py).

  list      the dead letters of a time window, one line each (the newest --limit, printed oldest first)
  summary   how many, by stage x source topic x reason (numbers, quoted values and ids in reasons masked)
  replay    send the original bytes of the selected records back to their source topic (dry run without --yes)

A replayed record carries the header opsloop-replayed-from; refused again, its dead letter says so
(``replayed_from``): `list` shows it, `summary` counts it (AFTER REPLAY), `replay` leaves it (--force sends it).

A read starts at the first offset at or after --since (``offsets_for_times``) and stops at the end offsets
read when it starts: it never waits for new dead letters and returns at once on an empty topic. A dead letter
this opsloop cannot read (not JSON, fields missing, a newer schema_version) is named on stderr and skipped.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import heapq
import logging
import math
import re
import shutil
import signal
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import FrameType
from typing import Any, Callable, Iterator

import orjson
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from opsloop.argtypes import finite, integer
from opsloop.audit.search import parse_duration
from opsloop.config import ConfigError, KafkaSettings, load_settings
from opsloop.kafka_clients import client_options, service_producer, without_auto_create
from opsloop.kafka_security import KafkaSecurityError, preflight
from opsloop.log import get_logger, setup_logging
from opsloop.records.deadletter import DEADLETTER_KEY_BYTES, REPLAYED_FROM_HEADER, SCHEMA_VERSION
from opsloop.topics import Topic
from opsloop.validation import shown

log = get_logger("deadletter")

# fields every dead letter has (opsloop.records.deadletter_record writes them all)
REQUIRED = ("reason", "stage", "source_topic", "partition", "offset", "key", "received_at")
# a key deadletter_record could not keep as UTF-8 (decoded with backslashreplace): not restorable exactly
_ESCAPED_BYTE = re.compile(r"\\x[0-9a-f]{2}")
BAD_SHOWN = 20            # unreadable dead letters / skipped replays named one by one; the rest counted
PROGRESS_EVERY_S = 2.0    # a read longer than this reports its progress on stderr this often
DEFAULT_TIMEOUT_S = 15.0
INTERRUPTED = 130         # a shell's status for a command ended by SIGINT (as `opsloop` gives any)
LOOK_EVERY_S = 2.0        # a replay looks this often whether the topics it sends to are still on the cluster

EPILOG = """examples:
  opsloop deadletter list --config opsloop.yaml                      # the last hour, the newest 100
  opsloop deadletter list --config opsloop.yaml --since 6h --stage stream --reason "not JSON"
  opsloop deadletter list --config opsloop.yaml --source-topic telemetry.lb --json   # whole records
  opsloop deadletter summary --config opsloop.yaml --since 24h        # counts by stage, source, reason
  opsloop deadletter replay --config opsloop.yaml --source-topic telemetry.lb --reason handler   # dry run
  opsloop deadletter replay --config opsloop.yaml --source-topic telemetry.lb --reason handler --yes

--since is a duration (90s, 10m, 1h, 2d) or "all" (everything the topic retains). --source-topic takes
the base name (telemetry.lb; kafka.topic_prefix is applied) or the name on the cluster. Brokers, TLS/SASL
and the topic prefix come from the `kafka` section of --config (--bootstrap overrides the brokers).
`list` prints time (UTC), stage, source topic/partition/offset, reason (cut to the terminal) and key.
`list` marks a record refused again after a replay with replayed-from=<the dead letter it was replayed from>.
`replay` sends each selected record's original bytes with its key and a header opsloop-replayed-from
(dead-letter topic/partition/offset), waits for the acknowledgements and reports counts; it never sends
a record kept truncated or with its key cut, nor one whose dead letter holds a sample or an excerpt
instead of the record; nor, without --force, one that was refused again after a replay; nor one whose
source topic does not exist on the cluster (status "no topic": a send would have the broker create it
with its default partitions; `opsloop stream worker` creates the missing ones at start; then replay).
A source topic deleted during a replay (looked for every 2 s) stops it: what was sent is reported, the rest
is not sent, and the topic is not re-created. The dead-letter topic deleted during a replay stops it too:
what was sent is reported (the dead letters not yet read went with the topic); so is a read Kafka stops
answering for --timeout (exit 2).
Exit: list, summary 0 when dead letters matched, 1 when none; replay 0 when every selected record was
sent (or, without --yes, could be), 1 when a send failed or a source topic does not exist (or it or the
dead-letter topic was deleted during the replay); 2 on bad input or unreachable Kafka.
A replay interrupted (Ctrl-C, SIGTERM) stops reading, waits for the acknowledgements of what it sent,
reports it and exits 130 (a new replay sends those again).
"""


class DeadLetterError(ValueError):
    """A dead letter this opsloop cannot read; the message names what is wrong."""


class NotReplayable(ValueError):
    """A readable dead letter whose record cannot be sent back as it was; the message says why (the same for
    alike records: counted by it), ``detail`` says it for this record."""

    def __init__(self, why: str, detail: str | None = None) -> None:
        super().__init__(why)
        self.detail = why if detail is None else detail


class ReadStalled(RuntimeError):
    """No record arrived for the time-out while partitions were short of their end offsets."""


class TopicGone(ReadStalled):
    """The topic being read was deleted under the read (gone from the cluster, or its offsets started again)."""


@dataclass(frozen=True, slots=True)
class Letter:
    """One dead letter as read: where it sits on the dead-letter topic, and its fields."""

    topic: str
    partition: int
    offset: int
    doc: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"

    @property
    def received_at(self) -> float:
        return float(self.doc["received_at"])

    @property
    def source(self) -> str:
        p, o = self.doc["partition"], self.doc["offset"]
        return f"{self.doc['source_topic'] or '-'}/{'-' if p is None else p}/{'-' if o is None else o}"


@dataclass(slots=True)
class Filters:
    reason: str | None = None
    source_topics: frozenset[str] = frozenset()
    stage: str | None = None

    def match(self, doc: dict[str, Any]) -> bool:
        if self.reason is not None and self.reason.lower() not in doc["reason"].lower():
            return False
        if self.source_topics and doc["source_topic"] not in self.source_topics:
            return False
        return self.stage is None or doc["stage"] == self.stage


# ---------------------------------------------------------------------------------------- one record


def decode_letter(value: bytes | None) -> dict[str, Any]:
    """The dead letter's fields, checked; :class:`DeadLetterError` naming the first problem."""
    if value is None:
        raise DeadLetterError("record has no value (tombstone)")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise DeadLetterError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise DeadLetterError(f"a JSON {type(doc).__name__}, expected an object")
    version = doc.get("schema_version", SCHEMA_VERSION)
    if type(version) is not int:   # noqa: E721 - bool is no version
        raise DeadLetterError(f"schema_version: {version!r} is not an integer")
    if version < 1:
        raise DeadLetterError(f"schema_version: {version} is not a version (1 or more)")
    if version > SCHEMA_VERSION:
        raise DeadLetterError(f"schema_version {version} is newer than this opsloop reads ({SCHEMA_VERSION}): "
                              "upgrade opsloop")
    missing = [f for f in REQUIRED if f not in doc]
    if missing:
        raise DeadLetterError(f"missing fields: {', '.join(missing)}")
    for name in ("reason", "stage", "source_topic"):
        if not isinstance(doc[name], str):
            raise DeadLetterError(f"{name}: expected a string, got {shown(doc[name])}")
    for name in ("partition", "offset"):
        if doc[name] is not None and (type(doc[name]) is not int or doc[name] < 0):   # noqa: E721
            raise DeadLetterError(f"{name}: expected an integer >= 0 or null, got {shown(doc[name])}")
    if doc["key"] is not None and not isinstance(doc["key"], str):
        raise DeadLetterError(f"key: expected a string or null, got {shown(doc['key'])}")
    at = doc["received_at"]
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not 0 <= at < 1e11:   # before year 5000
        raise DeadLetterError(f"received_at: expected seconds since the epoch, got {shown(at)}")
    if "value_b64" in doc and not isinstance(doc["value_b64"], str):
        raise DeadLetterError(f"value_b64: expected a string, got {shown(doc['value_b64'])}")
    # optional fields of newer dead letters (opsloop/records/deadletter.py); absent in older ones
    for name in ("truncated", "key_truncated"):
        if name in doc and not isinstance(doc[name], bool):
            raise DeadLetterError(f"{name}: expected true or false, got {shown(doc[name])}")
    if "key_bytes" in doc and (type(doc["key_bytes"]) is not int or doc["key_bytes"] < 0):   # noqa: E721
        raise DeadLetterError(f"key_bytes: expected an integer >= 0, got {shown(doc['key_bytes'])}")
    for name in ("replayed_from", "value_is"):
        if doc.get(name) is not None and not isinstance(doc[name], str):
            raise DeadLetterError(f"{name}: expected a string or null, got {shown(doc[name])}")
    return doc


# why a dead letter whose value is not the record cannot be replayed, by its value_is
_NOT_THE_RECORD = {
    "sample": "the dead letter holds one sample of the record (a bad sample of a batch, or one a handler "
              "refused), not the record's bytes",
    "samples": "the dead letter holds an excerpt of the record's rejected samples, not the record's bytes",
    "summary": "the dead letter holds a handler's summary of samples, not a record",
}


def refuse_replayed(doc: dict[str, Any]) -> None:
    """:class:`NotReplayable` for the dead letter of a record that was itself a replay: refused twice,
    a third time would be refused the same way until the cause is fixed (``--force`` skips this)."""
    origin = doc.get("replayed_from")
    if origin is not None:
        raise NotReplayable("refused again after a replay: fix the cause first, or --force",
                            f"refused again after a replay of {origin}: fix the cause first, or --force")


def original_value(doc: dict[str, Any]) -> bytes:
    """The refused record's bytes as the dead letter kept them; :class:`NotReplayable` when it kept less."""
    kind = doc.get("value_is")
    if kind is not None and kind != "record":
        raise NotReplayable(_NOT_THE_RECORD.get(kind, f"value_is {printable(kind[:40])!r}: not the record's bytes"))
    if doc.get("truncated"):
        raise NotReplayable("truncated: only the first bytes of the record were kept")
    if "value_b64" in doc:
        try:
            return base64.b64decode(doc["value_b64"], validate=True)
        except (binascii.Error, ValueError):
            raise NotReplayable("value_b64 is not base64") from None
    value = doc.get("value")
    if value is None:
        raise NotReplayable("no value (the record was a tombstone, or a handler's summary)")
    if not isinstance(value, str):
        # a stage that refused one sample of a batch keeps that sample or an excerpt, not the record
        raise NotReplayable("the dead letter holds a sample or an excerpt, not the record's bytes")
    return value.encode("utf-8", "surrogatepass")


def original_key(doc: dict[str, Any]) -> bytes | None:
    key = doc["key"]
    if key is None:
        return None
    if doc.get("key_truncated"):   # resent cut, it would land on another partition under another state key
        raise NotReplayable("key truncated: only its first bytes were kept",
                            f"key truncated: only the first {DEADLETTER_KEY_BYTES} of its "
                            f"{doc.get('key_bytes', '?')} bytes were kept")
    if _ESCAPED_BYTE.search(key):
        raise NotReplayable("key was not UTF-8: kept escaped, it cannot be restored exactly")
    return key.encode("utf-8", "surrogatepass")


_MULTI = re.compile(r"^\d+ of \d+ samples rejected \(\d+ kept\): ")
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
# an id: hex groups with a digit somewhere in the hex/dash run it starts (checked in _mask_ids: a look-ahead
# here rescanned the run from every word boundary, 18 s for a 16 KB reason of "a-a-a-...")
_ID = re.compile(r"\b[0-9a-f]{8,}(?:-[0-9a-f]{4,})*\b", re.I)
_HEX_OR_DASH = frozenset("0123456789abcdefABCDEF-")
# a number not preceded by a letter or _; a match starts at the first digit of a run (or the second, after a
# letter: "lb12" -> "lb1N"), never further in: every start inside a long run of digits rescanned it (5 s for
# 4,000 digits and a letter)
_NUMBER = re.compile(r"(?<![A-Za-z_])(?:[-+]\d+|(?:(?<!\d)|(?<=[A-Za-z_]\d))\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
                     r"(?![A-Za-z_\d])")
REASON_CHARS = 160
REASON_SCAN_CHARS = 1000   # what is masked of a reason: shown cut to REASON_CHARS anyway; bounds _QUOTED's work


def normalise_reason(reason: str) -> str:
    """The reason with what varies from record to record masked, so that alike refusals count as one:
    quoted values as '…', ids as <id>, numbers (sample positions, counts, times) as N. A record with
    several bad samples counts under its first reason."""
    multi = _MULTI.match(reason)
    if multi:
        reason = "several samples rejected, first: " + reason[multi.end():].split("; ")[0]
    text = _QUOTED.sub("'…'", reason[:REASON_SCAN_CHARS])
    text = _mask_ids(text)
    text = _NUMBER.sub("N", text)
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"


def _mask_ids(text: str) -> str:
    """Each _ID match as <id> when a digit follows its start within the same run of hex digits and dashes."""
    if _ID.search(text) is None:
        return text
    digit_ahead = [False] * (len(text) + 1)   # from the right: a digit at or after i, before the run ends
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        digit_ahead[i] = c.isdecimal() or (c in _HEX_OR_DASH and digit_ahead[i + 1])
    return _ID.sub(lambda m: "<id>" if digit_ahead[m.start()] else m.group(), text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text from a record made safe for a terminal line: no newline, no escape sequence (shown as \\xNN)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------- reading


@dataclass(slots=True)
class ReadStats:
    total: int = 0          # records between the start and end offsets (an upper bound for --since)
    read: int = 0
    unreadable: int = 0
    bad_shown: int = 0


@dataclass(slots=True)
class Reader:
    """The records of ``topic`` from ``since_ms`` (None: the beginning) to the end offsets at start."""

    kafka: KafkaSettings
    topic: str
    since_ms: int | None
    timeout_s: float
    progress: Callable[[ReadStats], None] | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    def letters(self) -> Iterator[Letter]:
        """Each readable dead letter, in offset order per partition; unreadable ones named on stderr."""
        for r in self._records():
            try:
                doc = decode_letter(r.value)
            except DeadLetterError as e:
                self.stats.unreadable += 1
                if self.stats.bad_shown < BAD_SHOWN:
                    self.stats.bad_shown += 1
                    print(f"opsloop deadletter: skipped unreadable dead letter {r.topic}/{r.partition}/{r.offset}: "
                          f"{e}", file=sys.stderr)
                continue
            yield Letter(r.topic, r.partition, r.offset, doc)

    def _records(self) -> Iterator[Any]:
        ms = int(self.timeout_s * 1000)
        consumer = KafkaConsumer(**client_options(self.kafka), group_id=None, enable_auto_commit=False,
                                 client_id="opsloop-deadletter", auto_offset_reset="earliest",
                                 bootstrap_timeout_ms=ms, request_timeout_ms=max(ms, 5000),
                                 allow_auto_create_topics=False)
        # its metadata requests asked the broker to create the topic: one deleted during the read came back empty,
        # and the read went on from its offset 0 (records of the new topic read as the old one's, or a stall)
        without_auto_create(consumer)
        try:
            tps = [TopicPartition(self.topic, p) for p in sorted(consumer.partitions_for_topic(self.topic))]
            if not tps:   # no such topic: nothing was ever dead-lettered under this prefix
                return
            end = consumer.end_offsets(tps)
            if self.since_ms is None:
                start = consumer.beginning_offsets(tps)
            else:
                found = consumer.offsets_for_times({tp: self.since_ms for tp in tps})
                start = {tp: found[tp].offset if found.get(tp) is not None else end[tp] for tp in tps}
            todo = {tp for tp in tps if start[tp] < end[tp]}
            self.stats.total = sum(end[tp] - start[tp] for tp in todo)
            if not todo:
                return
            consumer.assign(sorted(todo, key=lambda tp: tp.partition))
            for tp in todo:
                consumer.seek(tp, start[tp])
            yield from self._poll(consumer, todo, end)
        finally:
            consumer.close()

    def _poll(self, consumer: KafkaConsumer, todo: set[TopicPartition],
              end: dict[TopicPartition, int]) -> Iterator[Any]:
        last_moved = last_report = time.monotonic()
        positions = {tp: consumer.position(tp) for tp in todo}
        read_to = dict(positions)   # per partition, the offset after the last record read
        while todo:
            batch = consumer.poll(timeout_ms=500, max_records=2000)
            now = time.monotonic()
            for tp, records in batch.items():
                for r in records:
                    if r.offset < read_to[tp]:   # before what was read: the topic was deleted and made anew
                        raise self._gone(tp, r.offset)
                    if r.offset >= end[tp]:   # written after the read started: the next read's
                        break
                    read_to[tp] = r.offset + 1
                    self.stats.read += 1
                    if self.since_ms is None or r.timestamp >= self.since_ms:
                        yield r
            # progress is a position that moved (offsets without a record, e.g. transaction markers, count)
            moved = {tp: consumer.position(tp) for tp in todo}
            back = [tp for tp in todo if moved[tp] < read_to[tp]]   # reset to a new topic's start
            if back:
                raise self._gone(back[0], moved[back[0]])
            if moved != positions:
                positions, last_moved = moved, now
            for tp in [tp for tp in todo if moved[tp] >= end[tp]]:
                todo.discard(tp)
                consumer.pause(tp)
            if todo and now - last_moved > self.timeout_s:
                if not self._exists():   # deleted: said as such, not as Kafka not answering
                    raise TopicGone(f"{self.topic}: deleted during the read (no longer on the cluster)")
                short = ", ".join(f"{tp.partition} at {consumer.position(tp)} of {end[tp]}"
                                  for tp in sorted(todo, key=lambda tp: tp.partition))
                raise ReadStalled(f"{self.topic}: no progress for {self.timeout_s:g} s, partitions short of their "
                                  f"end offsets: {short}")
            if self.progress is not None and todo and now - last_report >= PROGRESS_EVERY_S:
                last_report = now
                self.progress(self.stats)

    def _gone(self, tp: TopicPartition, offset: int) -> TopicGone:
        return TopicGone(f"{self.topic}: deleted during the read (partition {tp.partition} started again at "
                         f"offset {offset})")

    def _exists(self) -> bool:
        """The topic is on the cluster; True when the cluster does not answer (a stall, not a deletion)."""
        try:
            return self.topic in existing_topics(self.kafka, self.timeout_s)
        except KafkaError:
            return True


def stderr_progress(topic: str) -> Callable[[ReadStats], None]:
    def report(stats: ReadStats) -> None:
        pct = 100 * stats.read / stats.total if stats.total else 100.0
        print(f"reading {topic}: {stats.read:,} of {stats.total:,} records ({pct:.0f} %)", file=sys.stderr, flush=True)
    return report


# ---------------------------------------------------------------------------------------- commands


def cmd_list(reader: Reader, filters: Filters, limit: int, as_json: bool) -> int:
    newest: list[tuple[float, int, int, Letter]] = []   # heap of the newest ``limit``
    matched = again = 0
    for letter in reader.letters():
        if not filters.match(letter.doc):
            continue
        matched += 1
        again += letter.doc.get("replayed_from") is not None
        item = (letter.received_at, letter.partition, letter.offset, letter)
        if len(newest) < limit:
            heapq.heappush(newest, item)
        elif item[:3] > newest[0][:3]:
            heapq.heapreplace(newest, item)
    shown = [item[3] for item in sorted(newest, key=lambda i: i[:3])]
    if as_json:
        for letter in shown:
            sys.stdout.write(orjson.dumps({**letter.doc, "deadletter": letter.where}, default=str).decode() + "\n")
    else:
        for line in render_lines(shown, shutil.get_terminal_size((160, 24)).columns):
            print(line)
    _footer(reader, matched, len(shown), again=again)
    return 0 if matched else 1


def render_lines(letters: list[Letter], width: int) -> list[str]:
    """time, stage, source topic/partition/offset, reason cut to fit the line, the dead letter it was
    replayed from (a replay refused again), key."""
    if not letters:
        return []
    stage_w = max(len(printable(lt.doc["stage"])) for lt in letters)
    source_w = max(len(printable(lt.source)) for lt in letters)
    out = []
    for lt in letters:
        key = None if lt.doc["key"] is None else printable(lt.doc["key"])
        key_part = "key=" + ("-" if key is None else (key if len(key) <= 40 else key[:39] + "…"))
        if lt.doc.get("key_truncated"):
            key_part += f" (cut, {lt.doc.get('key_bytes', '?')} bytes)"
        origin = lt.doc.get("replayed_from")
        if origin is not None:   # never cut: it tells a record refused twice from a new one
            key_part = f"replayed-from={printable(origin[:120])}  {key_part}"
        head = f"{_utc(lt.received_at)}  {printable(lt.doc['stage']):<{stage_w}}  {printable(lt.source):<{source_w}}  "
        room = max(20, width - len(head) - len(key_part) - 2)
        reason = printable(" ".join(lt.doc["reason"].split()))
        reason = reason if len(reason) <= room else reason[:room - 1] + "…"
        out.append(f"{head}{reason:<{room}}  {key_part}")
    return out


def cmd_summary(reader: Reader, filters: Filters, as_json: bool) -> int:
    counts: Counter[tuple[str, str, str]] = Counter()
    again: Counter[tuple[str, str, str]] = Counter()   # of them, records refused again after a replay
    newest: dict[tuple[str, str, str], float] = {}
    for letter in reader.letters():
        if not filters.match(letter.doc):
            continue
        group = (printable(letter.doc["stage"]), printable(letter.doc["source_topic"]) or "-",
                 printable(normalise_reason(letter.doc["reason"])))
        counts[group] += 1
        again[group] += letter.doc.get("replayed_from") is not None
        newest[group] = max(newest.get(group, 0.0), letter.received_at)
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if as_json:
        for (stage, source, reason), n in rows:
            g = (stage, source, reason)
            sys.stdout.write(orjson.dumps({"count": n, "after_replay": again[g], "stage": stage,
                                           "source_topic": source, "reason": reason,
                                           "newest": _utc(newest[g])}).decode() + "\n")
    elif rows:
        stage_w = max(5, *(len(g[0]) for g, _ in rows))
        source_w = max(12, *(len(g[1]) for g, _ in rows))
        count_w = max(5, len(str(rows[0][1])))
        print(f"{'COUNT':>{count_w}}  {'STAGE':<{stage_w}}  {'SOURCE TOPIC':<{source_w}}  {'NEWEST':<20}  "
              "AFTER REPLAY  REASON")
        for (stage, source, reason), n in rows:
            g = (stage, source, reason)
            print(f"{n:>{count_w}}  {stage:<{stage_w}}  {source:<{source_w}}  {_utc(newest[g]):<20}  "
                  f"{again[g]:>12}  {reason}")
    matched = sum(counts.values())
    _footer(reader, matched, matched, groups=len(rows), again=sum(again.values()))
    return 0 if matched else 1


def _footer(reader: Reader, matched: int, shown: int, groups: int | None = None, again: int = 0) -> None:
    """What was read, on stderr (stdout keeps the records): counts, and the unreadable ones skipped."""
    parts = [f"{matched} dead letter{'s' if matched != 1 else ''} matched"]
    if shown < matched:
        parts.append(f"the newest {shown} shown (--limit)")
    if groups is not None:
        parts.append(f"{groups} group{'s' if groups != 1 else ''}")
    if again:   # replaying these again is pointless until the cause is fixed
        parts.append(f"{again} refused again after a replay")
    if reader.stats.unreadable:
        parts.append(f"{reader.stats.unreadable} unreadable skipped")
    print(f"{reader.topic}: " + ", ".join(parts), file=sys.stderr)


@dataclass(slots=True)
class ReplayReport:
    selected: int = 0
    sent: int = 0
    failed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    no_topic: Counter[str] = field(default_factory=Counter)   # not replayed: source topic missing, by topic
    lines_shown: int = 0
    interrupted: bool = False
    unchecked: set[str] = field(default_factory=set)   # destinations of failed sends not yet looked for on the cluster
    deleted: list[str] = field(default_factory=list)   # source topics deleted during the replay
    stopped: bool = False   # for that, or a read error, before every selected dead letter was read
    read_error: str | None = None   # the read of the dead-letter topic stalled or lost its topic: stopped there
    deadletter_deleted: bool = False   # the dead-letter topic itself was deleted during the replay


def existing_topics(kafka: KafkaSettings, timeout_s: float) -> frozenset[str]:
    """The names of the cluster's topics (one metadata request)."""
    ms = int(timeout_s * 1000)
    admin = KafkaAdminClient(**client_options(kafka), client_id="opsloop-deadletter-replay",
                             bootstrap_timeout_ms=ms, request_timeout_ms=max(ms, 5000))
    try:
        return frozenset(admin.list_topics())
    finally:
        admin.close()


def deleted_topics(report: ReplayReport, sent_to: set[str], kafka: KafkaSettings, timeout_s: float) -> list[str]:
    """Of the topics sent to and those whose sends failed since the last look, the ones no longer on the cluster
    (deleted during the replay). A cluster that does not answer tells nothing: none (failures are reported as such)."""
    look, report.unchecked = sent_to | report.unchecked, set()
    try:
        return sorted(look - existing_topics(kafka, timeout_s))
    except KafkaError as e:
        log.warning("deadletter_replay_topics_unknown", topics=sorted(look)[:10],
                    error=f"{type(e).__name__}: {e}"[:300])
        return []


def cmd_replay(reader: Reader, filters: Filters, kafka: KafkaSettings, send: bool, limit: int | None,
               as_json: bool, timeout_s: float, force: bool = False) -> int:
    report = ReplayReport()
    producer = None
    # a send to a topic that is gone re-creates it with the broker's default partitions (auto.create.topics.enable;
    # kafka-python's producer ignores allow_auto_create_topics=False), or waits --timeout per record where the
    # broker does not create: such records are refused, named and counted. Read once: a replay is short.
    topics = existing_topics(kafka, timeout_s)
    # (dead letter without its record, destination, future) until acknowledged, oldest first: the values are
    # the producer's; acknowledged ones are reported (and dropped) as the replay goes
    pending: deque[tuple[Letter, str, Any]] = deque()
    sent_to: set[str] = set()   # looked for on the cluster every LOOK_EVERY_S: one deleted stops the replay
    next_look = time.monotonic() + LOOK_EVERY_S
    if send:
        producer = service_producer(kafka, "opsloop-deadletter-replay", linger_ms=5,
                                    max_block_ms=int(timeout_s * 1000),
                                    request_timeout_ms=max(int(timeout_s * 1000), 5000),
                                    delivery_timeout_ms=max(int(timeout_s * 2000), 10_000),
                                    allow_auto_create_topics=False)
        if not without_auto_create(producer):   # a source topic deleted meanwhile may come back: said
            log.warning("deadletter_replay_may_create_topics", error="this kafka-python's producer cannot be kept "
                        "from having the broker create a missing topic")
    try:
        try:
            for letter in reader.letters():
                # the topics were listed once, at the start: one deleted since fails every later send to it (each
                # after --timeout once the producer knows): stop there and say how far the replay got
                if (sent_to or report.unchecked) and time.monotonic() >= next_look:
                    next_look = time.monotonic() + LOOK_EVERY_S
                    if gone := deleted_topics(report, sent_to, kafka, timeout_s):
                        report.deleted, report.stopped = gone, True
                        break
                if not filters.match(letter.doc):
                    continue
                if limit is not None and report.selected >= limit:
                    break
                report.selected += 1
                destination = letter.doc["source_topic"]
                try:
                    if not force:
                        refuse_replayed(letter.doc)
                    value, key = original_value(letter.doc), original_key(letter.doc)
                except NotReplayable as e:
                    report.skipped[str(e)] += 1
                    _replay_line(report, as_json, letter, destination, "skipped", e.detail)
                    continue
                if destination not in topics:
                    report.no_topic[destination] += 1
                    _replay_line(report, as_json, letter, destination, "no topic",
                                 f"source topic {destination} does not exist: not replayed")
                    continue
                if producer is None:
                    report.sent += 1   # would be sent
                    _replay_line(report, as_json, letter, destination, "would send", f"{len(value)} bytes")
                    continue
                try:
                    fut = producer.send(destination, value=value, key=key,
                                        headers=[(REPLAYED_FROM_HEADER, letter.where.encode())])
                except (KafkaError, ValueError) as e:   # too large for the producer, metadata time-out, ...
                    _failed(report, as_json, letter, destination, e)
                    continue
                pending.append((Letter(letter.topic, letter.partition, letter.offset,
                                       {"key": letter.doc["key"]}), destination, fut))
                sent_to.add(destination)
                _report_acknowledged(report, as_json, pending)
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM: what was handed to the producer may still be delivered; wait for it and say
            # what was sent, not exit with no word of how far the replay got
            report.interrupted = True
        except ReadStalled as e:
            # the dead-letter topic deleted under the read (or Kafka not answering it): the same, what was sent is
            # reported; before, the command exited 2 with the read's error alone
            report.read_error, report.stopped = str(e), True
            report.deadletter_deleted = isinstance(e, TopicGone)
        if producer is not None:
            try:
                producer.flush(timeout=max(timeout_s * 2, 10.0) + 5)
            except KafkaError as e:   # what is not acknowledged by then: failed below
                log.warning("deadletter_replay_flush_timeout", error=f"{type(e).__name__}: {e}"[:300])
            _report_acknowledged(report, as_json, pending, final=True)
            if report.unchecked and not report.interrupted:   # the last sends' failures: a deletion is said too
                report.deleted = sorted(set(report.deleted) | set(deleted_topics(report, set(), kafka, timeout_s)))
    finally:
        if producer is not None:
            producer.close(timeout=5)
    _replay_summary(report, send, reader, as_json)
    if report.interrupted:
        return INTERRUPTED
    if report.read_error is not None and not report.deadletter_deleted:
        return 2   # Kafka did not answer the read
    return 1 if report.failed or report.no_topic or report.deleted or report.deadletter_deleted else 0


def _report_acknowledged(report: ReplayReport, as_json: bool, pending: deque[tuple[Letter, str, Any]],
                         final: bool = False) -> None:
    """Report the sends done at the head of ``pending``, in order; ``final``: all of them (what is not done
    now was not acknowledged in time)."""
    while pending and (final or pending[0][2].is_done):
        letter, destination, fut = pending.popleft()
        if fut.is_done and fut.succeeded():
            report.sent += 1
            _replay_line(report, as_json, letter, destination, "sent", "")
        else:
            _failed(report, as_json, letter, destination, fut.exception if fut.is_done else "not acknowledged in time")


def _failed(report: ReplayReport, as_json: bool, letter: Letter, destination: str, error: Any) -> None:
    report.failed += 1
    report.unchecked.add(destination)
    why = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    log.error("deadletter_replay_failed", deadletter=letter.where, topic=destination, error=why[:300])
    _replay_line(report, as_json, letter, destination, "failed", why[:300], force=True)


def _replay_line(report: ReplayReport, as_json: bool, letter: Letter, destination: str, status: str, detail: str,
                 force: bool = False) -> None:
    """One line per record (a failure always; the others up to a bound, then only counted)."""
    if as_json:
        sys.stdout.write(orjson.dumps({"deadletter": letter.where, "topic": destination, "key": letter.doc["key"],
                                       "status": status, "detail": detail}).decode() + "\n")
        return
    if report.lines_shown >= 1000 and not force:
        return
    report.lines_shown += 1
    shown_key = "-" if letter.doc["key"] is None else printable(letter.doc["key"][:40])
    print(f"{status:<10}  {letter.where}  ->  {printable(destination)}  key={shown_key}  {printable(detail)}".rstrip())


def _replay_summary(report: ReplayReport, send: bool, reader: Reader, as_json: bool) -> None:
    skipped = sum(report.skipped.values())
    why = "; ".join(f"{n} {reason}" for reason, n in report.skipped.most_common())
    no_topic = sum(report.no_topic.values())
    missing = (f", {no_topic} not replayed (no such source topic: "
               + ", ".join(f"{printable(t[:120])} ({n})" for t, n in report.no_topic.most_common()) + ")"
               if no_topic else "")
    if as_json:
        sys.stdout.write(orjson.dumps({"summary": {
            "dry_run": not send, "selected": report.selected, "sent" if send else "would_send": report.sent,
            "failed": report.failed, "skipped": dict(report.skipped), "no_topic": dict(report.no_topic),
            "unreadable": reader.stats.unreadable, **({"interrupted": True} if report.interrupted else {}),
            **({"deleted_topics": report.deleted, "stopped": report.stopped} if report.deleted else {}),
            **({"deadletter_deleted": report.deadletter_deleted, "stopped": True, "read_error": report.read_error}
               if report.read_error is not None else {})},
        }).decode() + "\n")
    out = sys.stderr if as_json else sys.stdout
    for topic, n in report.no_topic.items():   # the operator's to fix: on stderr as a log line too
        log.warning("deadletter_replay_topic_missing", topic=topic[:200], records=n)
    if report.deadletter_deleted:
        log.error("deadletter_replay_deadletter_deleted", topic=reader.topic[:200], sent=report.sent,
                  failed=report.failed, selected=report.selected)
    elif report.read_error is not None:
        log.error("deadletter_replay_read_stalled", topic=reader.topic[:200], sent=report.sent, failed=report.failed,
                  error=report.read_error[:300])
    if report.deleted:   # what was sent there went with it; the rest is not sent until it exists again
        log.error("deadletter_replay_topic_deleted", topics=[t[:200] for t in report.deleted[:10]], sent=report.sent,
                  failed=report.failed, stopped=report.stopped)
    if send:
        print(("replay INTERRUPTED: " if report.interrupted else "replay STOPPED: " if report.stopped else "replay: ")
              + f"{report.sent} of {report.selected} selected sent and acknowledged, {report.failed} failed, "
              f"{skipped} skipped" + (f" ({why})" if why else "") + missing, file=out)
        log.info("deadletter_replayed", topic=reader.topic, selected=report.selected, sent=report.sent,
                 failed=report.failed, skipped=skipped, no_topic=no_topic, interrupted=report.interrupted)
    else:
        head = "dry run INTERRUPTED: " if report.interrupted else "dry run STOPPED: " if report.stopped else "dry run: "
        print(head + f"{report.sent} of {report.selected} selected would be sent, {skipped} skipped"
              + (f" ({why})" if why else "") + missing + "; nothing was sent (--yes sends)", file=out)
    if report.deleted:
        print(f"source topic {', '.join(printable(t[:120]) for t in report.deleted)} was deleted during the replay"
              + ("; stopped: the dead letters after these were not replayed" if report.stopped else "")
              + "; a new replay says \"no topic\" for its records until it exists again", file=out)
    if report.deadletter_deleted:   # the dead letters not read went with it: no replay can send them
        print(f"dead-letter topic {printable(reader.topic[:120])} was deleted during the replay: the dead letters "
              "after these were not read and are gone with it", file=out)
    elif report.read_error is not None:
        print(f"stopped: {printable(report.read_error[:300])}; the dead letters after these were not read"
              + (f" (a new replay sends the {report.sent} sent here again)" if send else ""), file=out)
    if report.interrupted:   # at-least-once (docs/operations.md): say what a second run does
        print("interrupted: the dead letters after these were not read"
              + (f"; a new replay sends the {report.sent} sent here again" if send else ""), file=out)
    if reader.stats.unreadable:
        n = reader.stats.unreadable
        print(f"{n} unreadable dead letter{'s' if n != 1 else ''} skipped", file=out)


# ---------------------------------------------------------------------------------------- command line


def since_arg(text: str) -> float | None:
    """--since: seconds back from now, or None for "all"."""
    if text.strip().lower() == "all":
        return None
    try:
        return parse_duration(text, "--since").total_seconds()
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsloop deadletter", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help: str, since: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help, epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.add_argument("--config", help="opsloop YAML config (the kafka section: brokers, TLS/SASL, topic_prefix)")
        sp.add_argument("--bootstrap", help="override kafka.bootstrap_servers")
        sp.add_argument("--since", type=since_arg, default=since_arg(since), metavar="DURATION",
                        help=f"dead letters written this far back (default {since}; \"all\": the whole topic)")
        sp.add_argument("--reason", help="the reason contains this text (case-insensitive)")
        sp.add_argument("--source-topic", required=name == "replay", metavar="TOPIC",
                        help="the refused record's topic (base name or name on the cluster)")
        sp.add_argument("--stage", help="the stage that refused it (stream, paging, edge-control, actuator)")
        sp.add_argument("--json", action="store_true", help="one JSON object per line")
        sp.add_argument("--timeout", type=finite(0, low_ok=False), default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"give up when Kafka does not answer for S seconds (default {DEFAULT_TIMEOUT_S:g})")
        return sp

    ls = add("list", "the dead letters of a time window, one line each", "1h")
    ls.add_argument("--limit", type=integer(1), default=100, help="the newest N (default 100), printed oldest first")
    add("summary", "counts by stage, source topic and reason", "24h")
    rp = add("replay", "send the selected records back to their source topic (dry run without --yes)", "24h")
    rp.add_argument("--limit", type=integer(1), help="at most the first N selected (default: all)")
    rp.add_argument("--yes", action="store_true", help="send (without it: print what would be sent)")
    rp.add_argument("--force", action="store_true",
                    help="also replay records refused again after a replay (once their cause is fixed)")
    return p


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        settings = load_settings(a.config, {"kafka": {"bootstrap_servers": a.bootstrap}} if a.bootstrap else None)
    except ConfigError as e:
        print(f"opsloop deadletter: {e}", file=sys.stderr)
        return 2
    setup_logging("opsloop-deadletter", "warning")   # the output is the command's; JSON lines only for trouble
    # the client's own lines stay out: its retry chatter and the "Cancelled" errors of a closing client buried
    # the one line this command prints for any failure (the preflight still reads them, on the kafka logger)
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda record: not record.name.startswith("kafka"))
    if a.source_topic is not None and not a.source_topic.strip():
        print(f"opsloop deadletter {a.command}: --source-topic is empty", file=sys.stderr)
        return 2
    k = settings.kafka
    topic = k.topic(Topic.DEADLETTER.value)
    filters = Filters(reason=a.reason, stage=a.stage,
                      source_topics=frozenset({a.source_topic, k.topic(a.source_topic)}) if a.source_topic else
                      frozenset())
    if a.command == "replay" and topic in filters.source_topics:
        print(f"opsloop deadletter replay: --source-topic {a.source_topic} is the dead-letter topic itself",
              file=sys.stderr)
        return 2
    since_ms = None if a.since is None else int((time.time() - a.since) * 1000)
    reader = Reader(k, topic, since_ms, a.timeout, progress=stderr_progress(topic))
    try:
        if k.security.protocol != "PLAINTEXT":   # a wrong password or CA: one line, not a client retrying
            preflight(k.bootstrap_servers, k.security, timeout_s=a.timeout)
        if a.command == "list":
            return cmd_list(reader, filters, a.limit, a.json)
        if a.command == "summary":
            return cmd_summary(reader, filters, a.json)
        # SIGTERM ends a replay as Ctrl-C does, reported (a handler can be set in the main thread only)
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
        try:
            return cmd_replay(reader, filters, k, a.yes, a.limit, a.json, a.timeout, a.force)
        finally:
            if main_thread and previous is not None:
                signal.signal(signal.SIGTERM, previous)
    except (KafkaSecurityError, ReadStalled) as e:
        print(f"opsloop deadletter {a.command}: {e}", file=sys.stderr)
        return 2
    except KafkaError as e:   # no broker answering, a metadata or offsets request timing out
        print(f"opsloop deadletter {a.command}: Kafka at {k.bootstrap_servers}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
