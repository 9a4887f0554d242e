"""Versioned history of applied weights per listener and edge: JSON lines on disk, bounded.

One file per (edge, listener): ``<store_dir>/<edge>/<listener>.jsonl``, one entry per apply or
rollback. It answers "which version is live" (idempotence: the same version again is a no-op, an
older one is refused) and "what was live before" (rollback). Writers (the service and the
``opsloop weights`` CLI) take an exclusive ``flock`` so an entry is never interleaved; the file is
compacted to the newest ``history_max`` entries by an atomic rewrite (temporary file, fsync, rename).

Versions are ordered by their stamp ``(epoch, version)`` (see :class:`opsloop.records.EdgeWeights`);
an entry written before epochs existed has epoch 0.

Each entry names the kind of target it was written to (``target``: ``haproxy`` or ``lvs``; empty in entries
written before it was recorded, read as this target's). A listener whose target changed kind (LVS to HAProxy
or back) keeps one history: the entries up to the last one of another kind are set aside, not this target's
live weights (another scale, another LB: reconcile wrote them back, or their weights above 256 made the
file damage for HAProxy and the slot held until the file was moved aside). :meth:`WeightStore.history`
and :meth:`~WeightStore.last` are the entries after them (none right after the switch: the slot starts
from what the new target reads back, its first decision applies); one log line names the entries set
aside (``history_set_aside``). Their stamps still count in :meth:`~WeightStore.high_stamp`: a decision
older than the newest applied is stale whichever LB it went to.

A crash mid-write leaves a *torn tail*: bytes after the last newline. Reads ignore it, and the next
append cuts it off first, so the new entry starts on a line of its own. A complete line that is not an
entry is damage: :class:`StoreError` names the file and the line, and the service holds the live
weights (fail static) rather than guess which version is live.

Every value of an entry is checked as it loads, its range too, not only its type: a value no apply could
have written (a version or epoch beyond what a decision carries, a weight below 0 or above what the
target takes, a date before 1970 or after 9999, weights too many to audit) is damage like a wrong type. Such
values loaded, and then every decision was refused for good (an epoch of 2**63), every reconcile wrote
a batch and undid it (a weight of -5), every re-sent decision raised (thousands of weights: no audit
record holds them) or `weights history` died (applied_at 1e20), naming neither file nor line.

Next to it, ``<listener>.fail_static.json`` says the slot is failing static and since when (the
``first_seen`` of its open ``edge.fail_static`` finding), so a restarted service clears the finding a
previous run opened instead of leaving it open for good. When the slot leaves fail static the file
says ``"cleared": true`` until the clear has reached the broker (a restart sends it again), and
``"owed"`` lists earlier incidents whose clear had not reached it either; absent when nothing is owed.
Its times are checked like the history's: a ``since`` that is no date between 1970 and 9999 makes the file
damaged (logged naming the file and field, counted; open since now, as for an unreadable file: a stray
clear is harmless, a lost one pages); a ``cleared`` that is not true/false is damage too (named, counted)
and reads as open since ``since`` (so that incident's clear still goes out once fresh decisions are back);
an ``owed`` time that is none is dropped, named, and so are owed
clears beyond the newest :data:`MAX_OWED` (with the file's own incident, what the outbox keeps per finding:
5000 owed clears were 4968 ``finding_dropped`` errors at start). A ``since`` of -1e13
loaded, and the finding the service restated carried it to the paging service.

And ``<listener>.unverified.json``, written ahead of an LB write (atomically, before the write starts):
the origins that write may set to 0 over a weight the history gives them, while no write since has
been read back and recorded (a ``mismatch``, a torn batch whose undo failed, a crash between the write
and its entry leave it). A quiescing target (LVS) takes a live 0 under a stored weight above 0 for its
health checker's doing; an origin named here may be at 0 by our own write, so it is not (see
``EdgeActuator._down``). Gone once a write is read back and recorded; absent when nothing is owed.

And ``<listener>.intent.json``, the write-ahead intent of every LB write (apply, reconcile, rollback; written
atomically and fsynced before the write starts, removed once the outcome is audited): the weights read before,
the weights about to be written and the history entry that will record them. A kill between the write and its
entry left the history one entry short and the restart re-applied the version as "already live", audited with
before = after: the change that really happened was missing from the trail. The restart resolves an intent
left behind (``EdgeActuator``): audited with its real before/after, its entry appended if the weights landed.

An ``apply`` entry whose epoch was more than ``max_epoch_ahead_s`` ahead of its own ``applied_at`` (the
actuator's clock when it applied it: written before such decisions were refused, by a controller whose clock
was a year ahead or a hand-made record) does not order decisions (:meth:`WeightStore.high_stamp`): it would
outrank every real decision for good. It stays in the history for the audit; one log line names it
(``history_epoch_ahead_ignored``), counted in ``opsloop_actuator_errors_total{kind="epoch_ahead"}``.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import orjson

from opsloop.atomic_file import replace_file
from opsloop.log import get_logger
from opsloop.records.audit import MAX_STATE_BYTES
from opsloop.records.edge import LAST_EPOCH, MAX_VERSION
from opsloop.validation import is_time, shown

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.mapping import HAPROXY_MAX_WEIGHT, IPVS_MAX_WEIGHT
from opsloop.controllers.actuators.outbox import MAX_PER_ID

log = get_logger("actuator.store")
_SAFE = re.compile(r"[^A-Za-z0-9_.\-]")

Stamp = tuple[int, int]   # (epoch, version): the order of decisions
# The ranges of a stamp (MAX_VERSION, LAST_EPOCH) are the record's (opsloop.records.edge): a decoded decision is
# within them, and an entry beyond them is damage no decision could have written.
# owed clears kept from the fail-static state file: with the file's own incident, what the outbox keeps per finding
MAX_OWED = MAX_PER_ID - 1
# the kinds of target an entry can name, and the largest weight each takes ("": not recorded, this target's)
TARGET_MAX_WEIGHT = {"haproxy": HAPROXY_MAX_WEIGHT, "lvs": IPVS_MAX_WEIGHT}


class StoreError(ValueError):
    """The history file is unreadable; the message names the file and line."""


@dataclass
class Entry:
    version: int                       # decision version (a rollback: the version rolled back to)
    weights: dict[str, int]            # integer weights written
    shares: dict[str, float]           # shares applied (after the step bound)
    decision: dict[str, float]         # shares the decision asked for
    complete: bool = True              # False: step-bounded, the decision is not fully reached
    action: str = "apply"              # "apply" (a decision), "manual" (operator apply) or "rollback"
    applied_at: float = field(default_factory=time.time)
    computed_at: float | None = None
    reason: str = ""
    epoch: int = 0                     # generation of the controller that made the decision
    target: str = ""                   # kind of target written to ("haproxy", "lvs"; "": before it was recorded)

    @property
    def stamp(self) -> Stamp:
        return (self.epoch, self.version)

    def epoch_ahead_s(self) -> float:
        """How far the epoch (a controller's start time, ms) was ahead of the actuator's clock when applied."""
        return self.epoch / 1000.0 - self.applied_at

    @classmethod
    def from_dict(cls, doc: dict[str, Any], max_weight: int = IPVS_MAX_WEIGHT) -> "Entry":
        """The entry of a history line; TypeError or ValueError naming the field and its value.

        Every field checked, not only the three that order versions: a weight "lots" or applied_at
        "yesterday" (a hand edit, disk damage) loaded, then every apply, rollback and `weights history`
        failed on it with an error naming neither the file nor the line. Ranges too (module docstring);
        the weights against what the entry's own target takes (``max_weight`` for one that names none)."""
        entry = cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})
        if not isinstance(entry.target, str) or entry.target not in ("", *TARGET_MAX_WEIGHT):
            raise ValueError(f"target is {shown(entry.target)}, not one of {sorted(TARGET_MAX_WEIGHT)}")
        max_weight = TARGET_MAX_WEIGHT.get(entry.target, max_weight)
        if not _int(entry.version) or not 0 <= entry.version <= MAX_VERSION:
            raise ValueError(f"version is {shown(entry.version)}, not an integer in 0..{MAX_VERSION}")
        if not _int(entry.epoch) or not 0 <= entry.epoch <= LAST_EPOCH:
            raise ValueError(f"epoch is {shown(entry.epoch)}, not an integer in 0..{LAST_EPOCH} (a start time in "
                             "ms up to the year 9999)")
        if not isinstance(entry.weights, dict):
            raise TypeError(f"weights is {shown(entry.weights)}, not an object of integers")
        for origin, w in entry.weights.items():
            if not isinstance(origin, str) or not _int(w) or not 0 <= w <= max_weight:
                raise ValueError(f"weights[{shown(origin)}] is {shown(w)}, not an integer weight in 0..{max_weight} "
                                 "(what this target takes)")
        size = len(orjson.dumps(entry.weights))
        if size > MAX_STATE_BYTES:   # no target has that many origins, and no audit record holds them
            raise ValueError(f"weights: {len(entry.weights)} origins ({size} bytes), more than an audit record "
                             f"holds ({MAX_STATE_BYTES} bytes)")
        for name in ("shares", "decision"):
            value = getattr(entry, name)
            if not isinstance(value, dict) or not all(isinstance(k, str) and _number(v) for k, v in value.items()):
                raise TypeError(f"{name} must be an object of numbers")
        for name in ("applied_at", "computed_at"):
            value = getattr(entry, name)
            if not (value is None and name == "computed_at") and not is_time(value):
                raise ValueError(f"{name} is {shown(value)}, not a time (seconds since 1970 up to the year 9999)")
        if not isinstance(entry.complete, bool):
            raise TypeError(f"complete is {shown(entry.complete)}, not true/false")
        if not isinstance(entry.action, str) or entry.action not in ACTIONS:   # a list: "unhashable type", unnamed
            raise ValueError(f"action is {shown(entry.action)}, not one of {sorted(ACTIONS)}")
        if not isinstance(entry.reason, str):
            raise TypeError(f"reason is {shown(entry.reason)}, not a string")
        return entry


ACTIONS = frozenset({"apply", "manual", "rollback"})


@dataclass
class FailStaticState:
    """A slot's ``<listener>.fail_static.json``: failing static since ``since`` (the open finding's
    ``first_seen``), or (``cleared``) left but that clear not known to be delivered; ``owed``: the
    ``first_seen`` of earlier incidents whose clear was not delivered either (a restart sends them first)."""
    since: float
    cleared: bool = False
    owed: list[float] = field(default_factory=list)
    problem: str = ""    # what was wrong with the file (it was unreadable or damaged), for the service to count


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _date(v: object) -> bool:
    """A finding's first_seen: an :func:`~opsloop.validation.is_time` after the epoch itself (a first_seen of 0
    is taken for "now")."""
    return is_time(v) and v > 0   # type: ignore[operator]


def _safe(name: str) -> str:
    return _SAFE.sub("_", name) or "_"


def _complete_part(data: bytes) -> bytes:
    """``data`` up to and including its last newline (what was fully written)."""
    return data[:data.rfind(b"\n") + 1]


@dataclass
class Intent:
    """A write about to be made (``<listener>.intent.json``, module docstring): ``action`` is the audit action
    (``edge.weights.apply``, ``.reconcile``, ``.rollback``), ``entry`` the history entry that records it (None:
    a reconcile, which records none)."""
    action: str
    version: int | None
    before: dict[str, int]
    after: dict[str, int]
    entry: Entry | None
    at: float


class WeightStore:
    def __init__(self, root: Path, edge: str, listener: str, max_entries: int = 200,
                 max_weight: int = IPVS_MAX_WEIGHT, kind: str = "", max_epoch_ahead_s: float | None = None) -> None:
        self.path = Path(root) / _safe(edge) / f"{_safe(listener)}.jsonl"
        self.edge = edge
        # an apply entry whose epoch was further ahead of its applied_at orders nothing (None: every one orders)
        self.max_epoch_ahead_s = max_epoch_ahead_s
        self._ahead_said: Stamp | None = None   # the newest entry ignored for its epoch, last logged
        self.max_entries = max_entries
        self.max_weight = max_weight   # the largest weight the target takes: a stored one above it is damage
        # the target's kind, written into each entry; "": unknown (every entry read as this target's)
        self.kind = kind
        self._set_aside_said: tuple[Any, ...] | None = None   # the entries set aside last logged (once each)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path.with_suffix(".lock"), "a")
        except OSError as e:
            raise StoreError(f"{self.path}: cannot open the history ({e.strerror or e})") from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> list[Entry]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise StoreError(f"{self.path}: cannot read the history ({e.strerror or e})") from None
        entries = []
        # a torn tail (after the last newline) is an entry that never completed: not part of the history
        for i, line in enumerate(_complete_part(data).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
                if not isinstance(doc, dict):
                    raise TypeError(f"a JSON {type(doc).__name__}, not an object")
                entries.append(Entry.from_dict(doc, self.max_weight))
            except (orjson.JSONDecodeError, TypeError, KeyError, ValueError) as e:
                raise StoreError(f"{self.path} line {i}: not a history entry ({e}); move the file aside to "
                                 "start a fresh history (the live weights are held until then)") from None
        return entries

    def history(self) -> list[Entry]:
        """This target's entries: those after the last one written to another kind of target (module docstring)."""
        with self._locked():
            return self._this_targets(self._read())

    def _this_targets(self, entries: list[Entry]) -> list[Entry]:
        cut = max((i + 1 for i, e in enumerate(entries) if e.target and self.kind and e.target != self.kind),
                  default=0)
        if cut:
            self._say_set_aside(entries[:cut])
        return entries[cut:]

    def _say_set_aside(self, aside: list[Entry]) -> None:
        """One log line per set of entries set aside (each read of the slot meets them again)."""
        newest = aside[-1]
        said = (newest.target, newest.stamp, newest.applied_at)
        if said == self._set_aside_said:
            return
        self._set_aside_said = said
        kinds = sorted({e.target for e in aside if e.target})
        log.warning("history_set_aside", file=str(self.path), target=self.kind, entries=len(aside), kinds=kinds,
                    first=list(aside[0].stamp), last=list(newest.stamp),
                    reason=f"written to {'/'.join(kinds)} before this listener's target became {self.kind}: not its "
                           f"live weights; the slot starts from what {self.kind} reads back (their stamps still "
                           "order decisions)")

    def last(self) -> Entry | None:
        h = self.history()
        return h[-1] if h else None

    def high_stamp(self) -> Stamp | None:
        """The highest (epoch, version) of a decision applied (rollbacks and manual applies do not raise it), to
        any target of the slot: a decision older than it is stale whichever load balancer it went to."""
        with self._locked():
            applied = [e for e in self._read() if e.action == "apply"]
        if self.max_epoch_ahead_s is not None:
            ahead = [e for e in applied if e.epoch_ahead_s() > self.max_epoch_ahead_s]
            if ahead:
                self._say_ahead(ahead)
                applied = [e for e in applied if e.epoch_ahead_s() <= self.max_epoch_ahead_s]
        stamps = [e.stamp for e in applied]
        return max(stamps) if stamps else None

    def _say_ahead(self, ahead: list[Entry]) -> None:
        """One line (and one count) per newest entry ignored for its epoch: each read of the slot meets it."""
        newest = max(ahead, key=lambda e: e.stamp)
        if newest.stamp == self._ahead_said:
            return
        self._ahead_said = newest.stamp
        metrics.ERRORS.labels(self.edge, "epoch_ahead").inc()
        log.warning("history_epoch_ahead_ignored", file=str(self.path), entries=len(ahead), epoch=newest.epoch,
                    version=newest.version, ahead_s=round(newest.epoch_ahead_s(), 1),
                    max_epoch_ahead_s=self.max_epoch_ahead_s,
                    reason="applied with an epoch (a controller's start time) this far ahead of the actuator's "
                           "clock: no controller can outrank it, so it does not order decisions (kept for the "
                           "audit)")

    def high_water(self) -> int | None:
        """The version of :meth:`high_stamp` (for display)."""
        stamp = self.high_stamp()
        return stamp[1] if stamp else None

    def get(self, version: int) -> Entry | None:
        for e in reversed(self.history()):
            if e.version == version:
                return e
        return None

    def append(self, entry: Entry) -> None:
        """Add ``entry`` (written to this store's kind of target when it names none), compacting the file."""
        if not entry.target:
            entry.target = self.kind
        with self._locked():
            try:
                self._cut_torn_tail()
                with open(self.path, "ab") as f:
                    f.write(orjson.dumps(asdict(entry)) + b"\n")
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise StoreError(f"{self.path}: cannot append to the history ({e.strerror or e})") from None
            entries = self._read()
            if len(entries) > self.max_entries:
                self._rewrite(entries[-self.max_entries:])

    @property
    def fail_static_path(self) -> Path:
        return self.path.with_suffix(".fail_static.json")

    def fail_static_state(self) -> FailStaticState | None:
        """What this slot owes of its ``edge.fail_static`` finding (see :class:`FailStaticState`); None when
        nothing. An unreadable or damaged file counts as open since now (``problem`` says why): a stray clear
        is harmless, a lost one pages. The owed clears that are times are kept (module docstring)."""
        path = self.fail_static_path
        try:
            doc = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as e:
            log.warning("fail_static_state_unreadable", file=str(path), error=str(e)[:300])
            return FailStaticState(time.time(), problem=f"{path}: unreadable ({str(e)[:300]})")
        if not isinstance(doc, dict):
            return self._fail_static_damaged(f"a JSON {type(doc).__name__}, not an object", [])
        problems = []
        owed = doc.get("owed", [])
        if not isinstance(owed, list):
            problems.append(f"owed is {shown(owed)}, not a list of times: dropped")
            owed = []
        bad = [x for x in owed if not _date(x)]
        if bad:
            problems.append(f"owed holds {shown(bad)}, not times (seconds since 1970 up to the year 9999): dropped")
        times = [float(x) for x in owed if _date(x)]
        if len(times) > MAX_OWED:
            problems.append(f"owed holds {len(times)} clears, more than the {MAX_OWED} kept: the oldest "
                            f"{len(times) - MAX_OWED} dropped")
            times = times[-MAX_OWED:]
        cleared = doc.get("cleared", False)
        if not isinstance(cleared, bool):
            # open, as for a damaged file: a clear owed for ``since`` is sent once fresh decisions are back
            problems.append(f"cleared is {shown(cleared)}, not true/false: read as open")
            cleared = False
        since = doc.get("since")
        if not _date(since):
            problems.insert(0, f"since is {shown(since)}, not a time (seconds since 1970 up to the year 9999)")
            return self._fail_static_damaged("; ".join(problems), times)
        state = FailStaticState(float(since), cleared, times)
        if problems:
            state.problem = self._fail_static_problem("; ".join(problems))
        return state

    def _fail_static_damaged(self, why: str, owed: list[float]) -> FailStaticState:
        return FailStaticState(time.time(), owed=owed, problem=self._fail_static_problem(f"{why}; open since now"))

    def _fail_static_problem(self, why: str) -> str:
        log.warning("fail_static_state_damaged", file=str(self.fail_static_path), error=why[:500])
        return f"{self.fail_static_path}: {why}"[:1000]

    def set_fail_static(self, since: float | None, cleared: bool = False, owed: list[float] | None = None) -> None:
        """Record (atomically) that the slot fails static since ``since``, or that it left it (``cleared``)
        and that clear is not delivered yet, with the earlier clears not delivered (``owed``); None: nothing
        is owed (the file goes)."""
        path = self.fail_static_path
        try:
            if since is None:
                path.unlink(missing_ok=True)
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            doc: dict[str, Any] = {"since": since}
            if cleared:
                doc["cleared"] = True
            if owed:
                doc["owed"] = owed
            replace_file(path, orjson.dumps(doc))
        except OSError as e:
            raise StoreError(f"{path}: cannot record the fail-static state ({e.strerror or e})") from None

    @property
    def unverified_path(self) -> Path:
        return self.path.with_suffix(".unverified.json")

    def unverified_zeroed(self) -> set[str] | None:
        """The origins a write not yet read back and recorded may have set to 0 (see the module docstring);
        None when the file cannot be read: then any 0 may be ours."""
        try:
            doc = orjson.loads(self.unverified_path.read_bytes())
        except FileNotFoundError:
            return set()
        except (OSError, orjson.JSONDecodeError) as e:
            log.warning("unverified_writes_unreadable", file=str(self.unverified_path), error=str(e)[:300])
            return None
        zeroed = doc.get("zeroed") if isinstance(doc, dict) else None
        if not isinstance(zeroed, list) or not all(isinstance(o, str) for o in zeroed):
            log.warning("unverified_writes_unreadable", file=str(self.unverified_path), error="no zeroed list")
            return None
        return set(zeroed)

    def note_unverified(self, zeroed: set[str], weights: dict[str, int]) -> None:
        """Before a write of ``weights``: record (atomically, durably) that it may set ``zeroed`` to 0, added
        to what earlier unverified writes may have. StoreError when it cannot: the write must not start."""
        with self._locked():
            known = self.unverified_zeroed()
            if known is None or zeroed <= known:   # unreadable: "any 0 may be ours" says more already
                return
            doc = {"zeroed": sorted(zeroed | known), "weights": weights, "at": time.time()}
            try:
                replace_file(self.unverified_path, orjson.dumps(doc))
            except OSError as e:
                raise StoreError(f"{self.unverified_path}: cannot record the write about to be made "
                                 f"({e.strerror or e})") from None

    def clear_unverified(self) -> None:
        """A write was read back and its weights recorded: nothing is owed (no-op when nothing was)."""
        if not self.unverified_path.exists():
            return
        with self._locked():
            try:
                self.unverified_path.unlink(missing_ok=True)
            except OSError as e:
                raise StoreError(f"{self.unverified_path}: cannot remove ({e.strerror or e})") from None

    @property
    def intent_path(self) -> Path:
        return self.path.with_suffix(".intent.json")

    def write_intent(self, intent: Intent) -> None:
        """Before an LB write: record it (atomically, durably). StoreError when it cannot: the write must not
        start (a kill after it would leave a change nobody can audit)."""
        doc = {**asdict(intent), "entry": asdict(intent.entry) if intent.entry is not None else None}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_file(self.intent_path, orjson.dumps(doc))
        except OSError as e:
            raise StoreError(f"{self.intent_path}: cannot record the write about to be made "
                             f"({e.strerror or e})") from None

    def intent(self) -> Intent | None:
        """The write a previous run (or apply) began and did not see through; None when none. StoreError when
        the file is there but unreadable (named): the caller holds rather than guess."""
        try:
            doc = orjson.loads(self.intent_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as e:
            raise StoreError(f"{self.intent_path}: unreadable ({str(e)[:300]}); move it aside") from None
        try:
            if not isinstance(doc, dict):
                raise TypeError(f"a JSON {type(doc).__name__}, not an object")
            entry = doc.get("entry")
            intent = Intent(action=doc["action"], version=doc["version"], before=doc["before"], after=doc["after"],
                            entry=Entry.from_dict(entry, self.max_weight) if entry is not None else None,
                            at=doc["at"])
            for name in ("before", "after"):
                value = getattr(intent, name)
                if not isinstance(value, dict) or not all(isinstance(o, str) and _int(w) for o, w in value.items()):
                    raise TypeError(f"{name} is {shown(value)}, not an object of integer weights")
            if not isinstance(intent.action, str) or not is_time(intent.at) or \
                    not (intent.version is None or _int(intent.version)):
                raise ValueError(f"action {shown(intent.action)}, version {shown(intent.version)} or at "
                                 f"{shown(intent.at)} is not what an intent holds")
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"{self.intent_path}: not a write intent ({e}); move it aside") from None
        return intent

    def clear_intent(self) -> None:
        """The write's outcome is audited (and recorded): nothing to resolve after a restart."""
        try:
            self.intent_path.unlink(missing_ok=True)
        except OSError as e:
            raise StoreError(f"{self.intent_path}: cannot remove ({e.strerror or e})") from None

    def _cut_torn_tail(self) -> None:
        """Under the lock: drop bytes after the last newline (a crash mid-append) before appending."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size == 0:
            return
        with open(self.path, "r+b") as f:
            f.seek(max(0, size - 1))
            if f.read(1) == b"\n":
                return
            keep = len(_complete_part(self.path.read_bytes()))
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        log.warning("history_torn_tail_cut", file=str(self.path), bytes_dropped=size - keep)

    def _rewrite(self, entries: list[Entry]) -> None:
        replace_file(self.path, b"".join(orjson.dumps(asdict(e)) + b"\n" for e in entries))
