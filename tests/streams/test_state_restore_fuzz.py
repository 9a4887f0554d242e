"""A damaged detector state never stalls a key, a partition or the worker: each stateful handler's stored state
is damaged field by field and restored through the real path.

Every stateful handler of the worker (firewall, power, netperf, keystone, anomaly: the ``detector-state``
table; the LB rates and the edge demand keep nothing across a restart) builds its real state from good
telemetry through the real agent loop (``StatefulAgent.run_batch``: decode, FanOut, dead letters, the table
written through the table's codec, ``StateCodec``, as the changelog stores it). One key's stored value is then
damaged: each field in turn replaced by adversarial values (times before 1970 and after 9999, 1e308, negative
counts, wrong types, a huge list, unknown enum values, the field missing, an extra field), NaN and 1e400 in its
text, its bytes torn at every offset, and at random several fields at once (hypothesis). A fresh agent restores
it (``StatefulAgent.restore`` at its first batch, as after a start or a rebalance) and handles a few good rounds
of that key and of another.

Property: nothing raises out of a batch; every good sample is handled (no dead letter); the other key goes on;
the damaged key's state is either refused (``state_restore_failed`` naming handler, key and field; counted in
``opsloop_stream_state_dropped_total{reason="unreadable"}``) and starts afresh, or used; no finding carries a
time outside 1970..9999, a number that is not finite or beyond 1e60, or ``nan``/``inf`` in its text; and what
the handler wrote afterwards restores again without a refusal. A failure names handler, path and value.

Suite time: every adversarial value on every field is ~480 s of one core (six handlers); in `make test` each
field gets a third of the values, rotating so that every value reaches every third field (and every field
its missing and extra cases): ~160 s. ``OPSLOOP_STATE_FUZZ=full`` runs all of them (run when a state changes).

Before (old code): a damaged open finding (severity ``bogus``, a ``where`` that is no object, an extra field)
raised while the restored findings were shown, at every batch of the worker, for every handler (nothing
handled, for good); a value the restore did not expect to fail (an AttributeError; an OverflowError, as a
Keystone regime level of 1e13 raised while its gauge was set) did the same; and a value taken unchecked (a
negative sample count, a drop ratio of 0, a queue count that is no integer, a list cut short) made every later
sample of its key raise (dead-lettered) or put 1e308 or ``inf`` into a finding.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import math
import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import faust
import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from kafka import KafkaProducer
from prometheus_client import REGISTRY

from opsloop.config import Settings
from opsloop.records import Finding, Metric, metric
from opsloop.topics import Topic
from opsloop.wire import encode_batch
from opsloop.streams.agents import base as agents_base, findings_sink, stateful
from opsloop.streams.agents.base import DetectorHandler
from opsloop.streams.agents.findings_sink import ActiveFindings, FindingsSink
from opsloop.streams.agents.stateful import STATE_TABLE, StatefulAgent, state_table
from opsloop.streams.detectors.anomaly.handler import AnomalyHandler
from opsloop.streams.detectors.anomaly.settings import AnomalySettings, SeriesSpec
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.netperf.handler import NetperfHandler
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.edge.demand import DemandAggregator
from opsloop.streams.lb.rates import LbRates
from opsloop.streams.runtime import batch as runtime_batch
from tests.e2e.pipeline import start_worker
from tests.helpers import ConsumerMsg, SimTime, read_topic, scrape_metric, unique, wait_until
from tests.streams.agents.test_handlers import handler_keys
from tests.streams.agents.test_integration import committed_everything, detectors_config, findings_of, \
    iptables_round, produce, state_in_changelog

T0 = 1_795_310_400.0
LOGGER = "opsloop.stream.agents"
MAX_EVENT_TIME = 253402300799.0   # 9999-12-31T23:59:59Z, the last second a finding's time can be written as
MAX_GBPS = 1e5                    # netperf: the largest throughput a result may report
# The table's codec (faust's json before it read bytes that are no JSON), as the changelog values go through it;
# what it gives for such bytes
STATE_CODEC = faust.serializers.codecs.get_codec(
    state_table(faust.App("state-fuzz-codec", broker="kafka://127.0.0.1:1")).value_serializer)
UNREADABLE: Any = getattr(stateful, "UnreadableState", ())
AFTER = 3   # good rounds handled after the restore
MAX_NUMBER = 1e60   # beyond any number a detector reports (the anomaly detector's values stop at 1e50)
BIG_LIST = list(range(100_000))
ADVERSARIAL: list[tuple[str, Any]] = [
    ("before 1970", -1e13), ("-1", -1), ("after 9999", MAX_EVENT_TIME + 1), ("1e13", 1e13), ("1e308", 1e308),
    ("-1e308", -1e308), ("-2**63", -(2 ** 63)), ("0", 0), ("0.5", 0.5), ("7", 7), ("a string", "x"),
    ("unknown enum", "bogus-enum"), ("null", None), ("true", True), ("[]", []), ("{}", {}), ("an object", {"k": 1}),
    ("a huge list", BIG_LIST),
]


# ------------------------------------------------------------------------------------ the handlers' telemetry
def firewall_round(hv: str, ts: float, i: int) -> list[Metric]:
    odd = hv == "hv-v"   # the victim differs from its role: drift findings about it, and an open port
    return [metric("iptables_vm_port", {"protected": 0, "reason": "ingress chain missing"},
                   {"host": hv, "port_id": "p1", "vm": "vm1"}, ts),
            metric("iptables_vm_port", {"protected": 1}, {"host": hv, "port_id": "p2", "vm": "vm2"}, ts),
            metric("iptables_ruleset", {"base_fingerprint": "base-b" if odd else "base-a"},
                   {"host": hv, "role": "compute"}, ts),
            metric("iptables_software", {"version": "9.0" if odd else "9.4"},
                   {"host": hv, "package": "neutron", "role": "compute"}, ts)]


def power_round(host: str, ts: float, i: int) -> list[Metric]:
    watts = 300.0 if host == "st-v" else 150.0 + i % 3   # the victim deviates from its generation
    return [metric("ipmi_power", {"watts": watts}, {"host": host, "generation": "gen3", "raw_capacity_tb": "96"}, ts)]


def netperf_round(target_set: str, ts: float, i: int) -> list[Metric]:
    return [metric("netperf_throughput", {"mean_gbps": gbps}, {"host": "np0", "target_set": target_set,
                   "driver": "netperf", "test": "TCP_STREAM", "queues": str(q)}, ts)
            for q, gbps in ((1, 3.3), (8, 3.4 if i < 6 else 1.0))]   # no scaling; then a drop


def keystone_round(host: str, ts: float, i: int) -> list[Metric]:
    slow = i >= 8
    return [metric("keystone_probe", {"p50_ms": 600.0 if slow else 8.0 + i % 2, "count": 5},
                   {"host": host, "probe": "token"}, ts),
            metric("keystone_requests", {"p50_ms": 9.0, "count": 50},
                   {"host": host, "method": "POST", "endpoint": "/v3/auth/tokens"}, ts),
            metric("s3_frontend_requests", {"small_requests": 40, "small_p50_ms": 80.0, "small_p95_ms": 700.0,
                                            "max_ms": 900.0}, {"host": host}, ts),
            metric("s3_frontend_credential", {"keystone_validations": 80}, {"host": host, "access_key": "AK1"}, ts),
            metric("s3_frontend_credential", {"keystone_validations": 5}, {"host": host, "access_key": "AK2"}, ts)]


def anomaly_round(host: str, ts: float, i: int) -> list[Metric]:
    if host == "st-v":   # log-normal (modelled in log space), a burst from round 88 on: a finding open
        watts = 100.0 * math.exp(random.Random(i).gauss(0.0, 0.3)) * (30.0 if i >= 88 else 1.0)
    else:                # a short cycle around a level (modelled as is, with its period found)
        watts = 150.0 + (i * 7919 % 11) - 5.0
    return [metric("ipmi_power", {"watts": round(watts, 2)}, {"host": host}, ts)]


def anomaly_handler() -> AnomalyHandler:
    settings = AnomalySettings(series=[SeriesSpec(metric="ipmi_power", field="watts")], clear_after=5,
                               detector={"warmup_points": 8, "refractory": 5, "log_points": 20, "period_points": 40,
                                         "spike_skip": 10})
    return AnomalyHandler(settings, 300.0)


def anomaly_key(host: str) -> str:
    return AnomalyHandler.key("ipmi_power", "watts", {"host": host})


@dataclass(frozen=True)
class Kind:
    make: Callable[[], DetectorHandler]
    topic: str
    rounds: Callable[[str, float, int], list[Metric]]
    sources: tuple[str, ...]          # victim, other, more
    step_s: float
    warm: int                         # rounds that build the state
    key: Callable[[str], str] = str   # source -> its state key


KINDS: dict[str, Kind] = {
    "firewall": Kind(FirewallHandler, "telemetry.iptables", firewall_round, ("hv-v", "hv-o", "hv-x"), 60.0, 4),
    "power": Kind(PowerHandler, "telemetry.ipmi", power_round, ("st-v", "st-o", "st-x"), 60.0, 6),
    "netperf": Kind(NetperfHandler, "telemetry.netperf", netperf_round, ("ts-v", "ts-o"), 600.0, 8),
    "keystone": Kind(KeystoneHandler, "telemetry.keystone", keystone_round, ("ks-v", "ks-o"), 90.0, 12),
    "anomaly": Kind(anomaly_handler, "telemetry.ipmi", anomaly_round, ("st-v", "st-o"), 600.0, 90, anomaly_key),
    # the other series damaged: modelled as is, with a short period
    "anomaly-linear": Kind(anomaly_handler, "telemetry.ipmi", anomaly_round, ("st-o", "st-v"), 600.0, 90, anomaly_key),
}


# ------------------------------------------------------------------------------------------ the agent loop
class Event:
    def __init__(self, msg: ConsumerMsg) -> None:
        self.message = msg


class Table(dict):
    """The memory store as Faust fills it: every value through the table's codec, as the changelog holds it."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, STATE_CODEC.loads(STATE_CODEC.dumps(value)))


@contextlib.contextmanager
def sim_clock(now: float) -> Iterator[SimTime]:
    """The wall clock the runtime and the handlers read (decode's skew bound, the restore's trusted times)."""
    clock = SimTime(now)
    saved = runtime_batch.time, agents_base.time
    runtime_batch.time = agents_base.time = clock  # type: ignore[assignment]
    try:
        yield clock
    finally:
        runtime_batch.time, agents_base.time = saved  # type: ignore[assignment]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [dict(r.fields) for r in self.records if getattr(r, "event", "") == name]  # type: ignore[attr-defined]


@contextlib.contextmanager
def logged() -> Iterator[Records]:
    handler, logger = Records(), logging.getLogger(LOGGER)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@dataclass
class Outcome:
    problems: list[str] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)   # the state_restore_failed log lines
    published: list[tuple[str, Finding]] = field(default_factory=list)
    table: Table = field(default_factory=Table)


def new_agent(table: Table, out: Outcome, letters: list[str], *handlers: DetectorHandler) -> StatefulAgent:
    async def send(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        out.published.append((dict(headers)["event"].decode(), Finding.decode(value)))

    app = faust.App("state-fuzz", broker="kafka://127.0.0.1:1", value_serializer="raw")
    sink = FindingsSink(send, ActiveFindings())
    agent = StatefulAgent(app, list(handlers), Settings(), table, sink)  # type: ignore[arg-type]

    async def deadletter(dl: Any) -> None:
        letters.append(dl.reason)

    agent._send_deadletter = deadletter  # type: ignore[method-assign]
    agent._highwater = lambda topic, partition: None  # type: ignore[method-assign]
    return agent


def batch(kind: Kind, i: int) -> list[Event]:
    """Round ``i`` of every source, one record each, each source in its own partition."""
    return [Event(ConsumerMsg(kind.topic, p, 100 * i + p, source.encode(),
                              encode_batch(kind.rounds(source, T0 + kind.step_s * i, i))))
            for p, source in enumerate(kind.sources)]


def unreadable(handler: str) -> float:
    return REGISTRY.get_sample_value("opsloop_stream_state_dropped_total",
                                     {"handler": handler, "reason": "unreadable"}) or 0.0


@functools.lru_cache(maxsize=None)
def built(name: str) -> tuple[dict[str, Any], str]:
    """The table after ``warm`` good rounds (every key's value as stored), and the handler's name."""
    kind = KINDS[name]
    table, out, letters = Table(), Outcome(), []
    handler = kind.make()
    agent = new_agent(table, out, letters, handler)
    with sim_clock(T0 + kind.step_s * kind.warm + 60):
        for i in range(kind.warm):
            asyncio.run(agent.run_batch(batch(kind, i)))
    assert not letters, letters
    victim = f"{handler.name}|{kind.key(kind.sources[0])}"
    assert victim in table and out.published, "the state to damage holds open findings"
    return dict(table), handler.name


def restored_and_run(name: str, damaged: Any) -> Outcome:
    """A fresh agent whose table holds the built state with the victim's value ``damaged``: restored at the
    first batch, then AFTER good rounds of every source. The property is checked; problems in ``problems``."""
    kind = KINDS[name]
    states, handler_name = built(name)
    keys = [f"{handler_name}|{kind.key(s)}" for s in kind.sources]
    out = Outcome()
    dict.update(out.table, copy.deepcopy(states))
    dict.__setitem__(out.table, keys[0], damaged)
    letters: list[str] = []
    handler = kind.make()
    agent = new_agent(out.table, out, letters, handler)
    before = unreadable(handler_name)
    now = T0 + kind.step_s * (kind.warm + AFTER) + 60
    with sim_clock(now), logged() as log:
        for j in range(AFTER):
            written = dict(out.table)
            try:
                asyncio.run(agent.run_batch(batch(kind, kind.warm + j)))
            except Exception as e:  # noqa: BLE001 - the property: never
                out.problems.append(f"batch {j} raised {type(e).__name__}: {e}"[:300])
                continue
            for key in keys[:2]:   # the damaged key and another: handled, their state written again
                if key not in out.table or out.table[key] is written.get(key):
                    out.problems.append(f"batch {j}: {key} not handled (state not written)")
        out.refused = log.events("state_restore_failed")
        # what it wrote restores again, without a refusal
        new_agent(out.table, Outcome(), [], kind.make()).restore()
        if len(log.events("state_restore_failed")) != len(out.refused):
            out.problems.append(f"the state written after the restore is refused again: "
                                f"{log.events('state_restore_failed')[-1]}")
    if letters:
        out.problems.append(f"{len(letters)} dead letters: {letters[0][:200]}")
    refusals = unreadable(handler_name) - before
    if refusals != len(out.refused):
        out.problems.append(f"{refusals:g} counted unreadable, {len(out.refused)} logged")
    for r in out.refused:
        if r.get("handler") != handler_name or r.get("key") != kind.key(kind.sources[0]) or not r.get("field"):
            out.problems.append(f"refusal does not name handler, key and field: {r}")
    for event, f in out.published:
        if (why := absurd(f)) is not None:
            out.problems.append(f"{event} {f.detector} {f.where}: {why}")
    return out


_NOT_FINITE = re.compile(r"(?<![a-z])(nan|inf|infinity)(?![a-z])", re.IGNORECASE)


def absurd(f: Finding) -> str | None:
    """Why a finding's numbers are absurd, or None."""
    for name in ("first_seen", "last_seen"):
        v = getattr(f, name)
        if not (math.isfinite(v) and 0.0 <= v <= MAX_EVENT_TIME):
            return f"{name} {v!r} is no time"
    if f.last_seen < f.first_seen:
        return "last_seen before first_seen"
    for name in ("observed", "expected", "score"):
        v = getattr(f, name)
        if isinstance(v, float) and not (math.isfinite(v) and abs(v) <= MAX_NUMBER):
            return f"{name} {v!r}"
    if _NOT_FINITE.search(f.explanation) or (isinstance(f.observed, str) and _NOT_FINITE.search(f.observed)):
        return f"explanation {f.explanation[:200]!r}"
    return None


# ------------------------------------------------------------------------------------------ damaging a state
Path = tuple[Any, ...]


def paths(doc: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every field of ``doc``: object members, and the first and last entry of a list."""
    if prefix:
        yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(doc, list) and doc:
        for i in sorted({0, len(doc) - 1}):
            yield from paths(doc[i], prefix + (i,))


def at(doc: Any, path: Path) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def replaced(doc: Any, path: Path, value: Any) -> Any:
    out = copy.deepcopy(doc)
    at(out, path[:-1])[path[-1]] = value if value is BIG_LIST else copy.deepcopy(value)
    return out


def removed(doc: Any, path: Path) -> Any:
    out = copy.deepcopy(doc)
    del at(out, path[:-1])[path[-1]]
    return out


# every adversarial value on every field, or (the default) a rotating third of them: module docstring
FULL_SWEEP = os.environ.get("OPSLOOP_STATE_FUZZ", "") == "full"
ROTATION = 1 if FULL_SWEEP else 3


def damaged_states(state: Any) -> Iterator[tuple[str, Any]]:
    """(what, value as the table gives it back) for every field and adversarial value (those of its rotation), a
    missing field, an extra one; through the table's codec (a value it cannot carry is what the changelog cannot
    hold either)."""
    for j, path in enumerate(paths(state)):
        where = "/".join(map(str, path))
        cases = [(name, replaced(state, path, v)) for i, (name, v) in enumerate(ADVERSARIAL)
                 if (i - j) % ROTATION == 0]
        cases.append(("missing", removed(state, path)))
        if isinstance(at(state, path), dict):
            extra = copy.deepcopy(state)
            at(extra, path)["zz_extra"] = 1
            cases.append(("an extra field", extra))
        for name, doc in cases:
            try:
                raw = STATE_CODEC.dumps(doc)
            except Exception:  # noqa: BLE001 - not storable (an int beyond 64 bits): never in the table
                continue
            yield f"{where} = {name}", STATE_CODEC.loads(raw)


def victim_state(name: str) -> Any:
    states, handler_name = built(name)
    return states[f"{handler_name}|{KINDS[name].key(KINDS[name].sources[0])}"]


def report(failures: list[str]) -> str:
    return f"{len(failures)} cases failed, e.g.:\n" + "\n".join(failures[:25])


# ----------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", sorted(KINDS))
def test_the_state_as_written_restores_without_a_refusal(name: str) -> None:
    out = restored_and_run(name, victim_state(name))
    assert not out.problems and not out.refused, out.problems or out.refused


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_field_damaged_in_turn_is_refused_or_used_never_a_stall(name: str) -> None:
    failures, refused, cases = [], 0, 0
    for what, value in damaged_states(victim_state(name)):
        cases += 1
        out = restored_and_run(name, value)
        refused += bool(out.refused)
        failures += [f"{what}: {p}" for p in out.problems]
    assert not failures, report(failures)
    assert cases > 300 / ROTATION and refused > cases / 4, (cases, refused)   # the sweep did reach the checks


@pytest.mark.parametrize("name", sorted(KINDS))
def test_nan_and_infinity_in_the_stored_text_are_refused(name: str) -> None:
    state = victim_state(name)
    numbers = [p for p in paths(state) if isinstance(at(state, p), float)][:12]
    assert numbers
    failures = []
    for path in numbers:
        raw = STATE_CODEC.dumps(replaced(state, path, "@@number@@"))
        for text in (b"NaN", b"1e400", b"-1e400", b"Infinity"):
            value = STATE_CODEC.loads(raw.replace(b'"@@number@@"', text))
            assert isinstance(value, UNREADABLE), (path, text)
            out = restored_and_run(name, value)
            failures += [f"{path} = {text!r}: {p}" for p in out.problems]
            if [r["field"] for r in out.refused] != ["state"]:
                failures.append(f"{path} = {text!r}: not refused as unreadable: {out.refused}")
    assert not failures, report(failures)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_torn_bytes_at_every_offset_are_refused_and_the_key_starts_afresh(name: str) -> None:
    raw = STATE_CODEC.dumps(victim_state(name))
    torn = [STATE_CODEC.loads(raw[:cut]) for cut in range(len(raw))]
    assert all(isinstance(v, UNREADABLE) for v in torn), [cut for cut, v in enumerate(torn)
                                                          if not isinstance(v, UNREADABLE)][:10]
    failures = []
    for cut in sorted({0, 1, len(raw) - 1, *range(0, len(raw), max(1, len(raw) // 25))}):
        out = restored_and_run(name, torn[cut])
        failures += [f"cut at {cut}: {p}" for p in out.problems]
        if len(out.refused) != 1:
            failures.append(f"cut at {cut}: refused {len(out.refused)} times")
    assert not failures, report(failures)


@st.composite
def several_damaged(draw: st.DrawFn, name: str) -> Any:
    state = copy.deepcopy(victim_state(name))
    fields = list(paths(state))
    for _ in range(draw(st.integers(2, 6))):
        path = draw(st.sampled_from(fields))
        try:
            parent = at(state, path[:-1])
            parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue   # gone with an earlier damage
        if not isinstance(parent, (dict, list)):
            continue   # an earlier damage made it a string (indexable, not assignable)
        value = draw(st.one_of(st.sampled_from([v for _, v in ADVERSARIAL if v is not BIG_LIST]),
                               st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2 ** 63), 2 ** 63 - 1),
                               st.text(max_size=5)))
        parent[path[-1]] = value
    return STATE_CODEC.loads(STATE_CODEC.dumps(state))


@pytest.mark.parametrize("name", sorted(KINDS))
def test_several_fields_damaged_at_once(name: str) -> None:
    @settings(max_examples=150 if FULL_SWEEP else 50, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(several_damaged(name))
    def check(value: Any) -> None:
        out = restored_and_run(name, value)
        assert not out.problems, out.problems

    check()


# ------------------------------------------------------------------------ what the sweep found, one by one
def test_a_damaged_open_finding_no_longer_stops_every_batch_of_the_worker() -> None:
    """Before: the restore built the restored open findings unchecked (to show them in /metrics); one with a
    severity no version writes raised there, out of the restore, at every batch: no handler of the worker
    handled anything again (the power handler's samples below included), for good."""
    states, _ = built("firewall")
    table = Table()
    dict.update(table, copy.deepcopy(states))
    victim = table["firewall-detector|hv-v"]
    next(iter(victim["book"]["open"].values()))["severity"] = "bogus-enum"
    out, letters = Outcome(), []
    agent = new_agent(table, out, letters, FirewallHandler(), PowerHandler())
    kind = KINDS["firewall"]
    with sim_clock(T0 + 3600), logged() as log:
        for i in range(kind.warm, kind.warm + 3):
            asyncio.run(agent.run_batch([*batch(kind, i), Event(ConsumerMsg(
                "telemetry.ipmi", 0, 1000 + i, b"st-a", encode_batch(power_round("st-a", T0 + 60 * i, i))))]))
        [refusal] = log.events("state_restore_failed")
    assert refusal["handler"] == "firewall-detector" and refusal["key"] == "hv-v"
    assert refusal["field"].startswith("book.open[") and refusal["field"].endswith("]")
    assert "severity" in refusal["error"]
    assert not letters
    assert table["power-detector|st-a"]["sums"][1] == 3                      # the other handler went on
    assert table["firewall-detector|hv-o"]["report"]["timestamp"] == T0 + 60 * (kind.warm + 2)
    # the refused key started afresh: its port finding opened again, its rounds handled
    assert table["firewall-detector|hv-v"]["report"]["timestamp"] == T0 + 60 * (kind.warm + 2)
    assert ("opened", "hv-v") in [(e, f.where.get("hypervisor")) for e, f in out.published]


def test_a_restore_error_nobody_expected_refuses_the_key_not_the_worker() -> None:
    """Before: the restore caught KeyError, TypeError and ValueError only; an AttributeError (a book that is a
    number) or an OverflowError (a count of 1e308) escaped it and failed every batch of the worker."""
    states, _ = built("power")
    table = Table()
    dict.update(table, copy.deepcopy(states))
    table["power-detector|st-v"]["book"] = 5
    out, letters = Outcome(), []
    agent = new_agent(table, out, letters, PowerHandler())
    before = unreadable("power-detector")
    with sim_clock(T0 + 3600), logged() as log:
        asyncio.run(agent.run_batch(batch(KINDS["power"], 10)))
        [refusal] = log.events("state_restore_failed")
    assert refusal["field"] == "book" and unreadable("power-detector") == before + 1
    assert not letters and table["power-detector|st-v"]["sums"][1] == 1   # afresh, its reading handled


def test_a_refused_key_that_never_comes_back_is_dropped_by_the_ttl_with_its_table_entry() -> None:
    """A refused key ages from the restore like a restored one: silent for the TTL, it is dropped and its
    damaged table entry deleted (else refused again at every start, for good)."""
    states, _ = built("firewall")
    table = Table()
    dict.update(table, copy.deepcopy(states))
    table["firewall-detector|hv-v"]["report"]["timestamp"] = "yesterday"
    handler = FirewallHandler()
    handler.bound_state(max_clock_skew_s=300.0, state_ttl_s=600.0, max_state_keys=100)
    agent = new_agent(table, Outcome(), [], handler)
    kind = KINDS["firewall"]
    others = [e for e in batch(kind, kind.warm) if e.message.key != b"hv-v"]
    with sim_clock(T0 + 3600) as clock:
        asyncio.run(agent.run_batch(others))
        assert "firewall-detector|hv-v" in table          # refused, not yet forgotten
        clock.now += 700
        asyncio.run(agent.run_batch([e for e in batch(kind, kind.warm + 1) if e.message.key != b"hv-v"]))
    assert "firewall-detector|hv-v" not in table and "firewall-detector|hv-o" in table


class BrokenRestore(PowerHandler):
    name = "broken-restore"

    def after_restore(self) -> None:
        raise RuntimeError("a bug after the restore")


def test_a_handler_whose_restore_fails_starts_empty_and_the_others_go_on() -> None:
    """Before: an error out of a handler's restore (not one key's) escaped the agent's restore, which was
    tried again at the next batch, and failed again: no handler handled a batch again."""
    table, out, letters = Table(), Outcome(), []
    agent = new_agent(table, out, letters, FirewallHandler(), BrokenRestore())
    dict.__setitem__(table, "broken-restore|st-a", {"spec": None, "sums": [150.0, 3], "book": {}})
    before = unreadable("broken-restore")
    kind = KINDS["firewall"]
    with sim_clock(T0 + 3600):
        for i in range(3):
            asyncio.run(agent.run_batch(batch(kind, i)))
    assert not agent.needs_restore and unreadable("broken-restore") == before + 1
    assert table["firewall-detector|hv-o"]["report"]["timestamp"] == T0 + 60 * 2
    assert [e for e, f in out.published if f.where.get("hypervisor") == "hv-v"][:1] == ["opened"]


def test_the_state_table_reads_bytes_that_are_no_json_as_an_unreadable_state() -> None:
    """Before: the table used Faust's json codec, which raised inside the recovery for a torn changelog record:
    skipped without naming its key (an older value of the key restored instead), and the last record of its
    partition held the recovery until the watchdog skipped it as a gap."""
    app = faust.App("state-codec", broker="kafka://127.0.0.1:1", value_serializer="raw")
    table = state_table(app)
    topic = table.changelog_topic.clone()   # the recovery reads a clone of it

    class Message:
        key = b'"firewall-detector|hv-v"'
        headers: dict[str, bytes] = {}

        def __init__(self, value: bytes | None) -> None:
            self.value = value

    raw = STATE_CODEC.dumps(victim_state("firewall"))
    assert app.serializers.dumps_value(None, {"a": 1.5}, serializer=table.value_serializer) == b'{"a":1.5}'
    assert topic.schema.loads_value(app, Message(raw)) == victim_state("firewall")   # JSON as before
    assert topic.schema.loads_value(app, Message(None)) is None                      # a tombstone as before
    for value in (raw[:len(raw) // 2], b"\xff\xfe", b"NaN", b'{"x": 1e400}', b""):
        assert isinstance(topic.schema.loads_value(app, Message(value)), UNREADABLE)


def test_a_stored_report_is_read_as_written_not_coerced() -> None:
    """Before: the firewall restore read a stored report as it reads one given as input, with ``str()`` and
    ``bool()`` of anything: ``chain_present: "false"`` came back as a protected port (its gauge showed no
    unprotected port while its critical finding was open), a report of another hypervisor under this one's key
    was shown as this one, a time before 1970 as its last round's. Each is refused now, naming the field."""
    states, _ = built("firewall")
    report = states["firewall-detector|hv-v"]["report"]
    damaged = {"report.ports[0].chain_present": {**report, "ports": [{**report["ports"][0], "chain_present": "false"},
                                                                     *report["ports"][1:]]},
               "report.hypervisor": {**report, "hypervisor": "hv-o"},
               "report.timestamp": {**report, "timestamp": -1e13}}
    for field_name, bad in damaged.items():
        value = copy.deepcopy(states["firewall-detector|hv-v"])
        value["report"] = bad
        out = restored_and_run("firewall", STATE_CODEC.loads(STATE_CODEC.dumps(value)))
        assert not out.problems, out.problems
        assert [r["field"] for r in out.refused] == [field_name]


def test_a_saved_finding_event_stamped_at_no_time_is_skipped_not_sent() -> None:
    """Before: the findings outbox saved in ``stream.data_dir`` took back an event whatever its times (the
    record's own decoding accepts any finite number): first_seen -1e13 was sent to the findings topic, whose
    consumers cannot write it as a time (the paging actuator's alert). Skipped and counted now, the others kept."""
    good = Finding(detector="firewall.unprotected_port", what="VM port without its security-group chain",
                   where={"hypervisor": "hv-v", "port": "p1"}, first_seen=T0, last_seen=T0 + 60)
    events = [("opened", good), ("opened", good.model_copy(update={"first_seen": -1e13})),
              ("refreshed", good.model_copy(update={"last_seen": MAX_EVENT_TIME + 1})), ("refreshed", good)]
    data = orjson.dumps({"format": findings_sink.OUTBOX_FORMAT, "version": findings_sink.OUTBOX_VERSION,
                         "saved_at": T0, "events": [{"event": e, "finding": orjson.loads(f.encode())}
                                                    for e, f in events]})
    kept, skipped = findings_sink.parse_outbox(data)
    assert kept == [events[0], events[3]]
    assert [e.split(":")[0] for e in skipped] == ["events[1]", "events[2]"]
    assert "first_seen" in skipped[0] and "last_seen" in skipped[1]


def test_results_beyond_a_plausible_throughput_are_rejected_not_stored() -> None:
    """Before: 1e308 Gb/s (valid on the wire) became the target set's baseline: every finding of the series
    carried it, and its state was one no restore takes (beyond MAX_GBPS)."""
    h = NetperfHandler()
    tags = {"host": "np0", "target_set": "ts-big", "driver": "netperf", "test": "TCP_STREAM", "queues": "1"}
    h.handle([metric("netperf_throughput", {"mean_gbps": 3.0}, tags, T0),
              metric("netperf_throughput", {"mean_gbps": 1e308}, tags, T0 + 60),
              metric("netperf_throughput", {"mean_gbps": -2.0}, tags, T0 + 120),
              metric("netperf_throughput", {"mean_gbps": MAX_GBPS}, tags, T0 + 180)], T0 + 200)
    assert h.rejected == 2
    state = STATE_CODEC.loads(STATE_CODEC.dumps(h.state_of("ts-big")))
    assert max(v for vs in state["detector"]["history"].values() for v in vs) == MAX_GBPS
    fresh = NetperfHandler()
    before = unreadable(fresh.name)
    fresh.restore({"ts-big": state})
    assert unreadable(fresh.name) == before and "ts-big" in fresh.detectors


def test_keystone_rounds_no_state_can_hold_are_rejected() -> None:
    """Before: a latency of 1e308 ms opened a regime finding of ~1e308 ms (its ratio inf) and left a level no
    restore takes; 1e300 validations an integer JSON cannot carry (the host's state could not be written any
    more); 1e308 ms in a small-requests round a bucket whose bound overflows a float at its window's quantile."""
    h = KeystoneHandler()
    host = {"host": "ks-big"}
    h.handle([metric("keystone_probe", {"p50_ms": 8.0, "count": 5}, {**host, "probe": "token"}, T0 + i * 60)
              for i in range(8)], T0 + 500)
    h.handle([metric("keystone_probe", {"p50_ms": 1e308, "count": 5}, {**host, "probe": "token"}, T0 + 600),
              metric("s3_frontend_credential", {"keystone_validations": 1e300}, {**host, "access_key": "AK"}, T0 + 600),
              metric("s3_frontend_requests", {"small_requests": 40, "small_p50_ms": 1.0, "small_p95_ms": 1e308},
                     host, T0 + 600)], T0 + 700)
    assert h.rejected == 3
    assert not [f for e, f in h.drain_outbox() if absurd(f)]
    state = STATE_CODEC.loads(STATE_CODEC.dumps(h.state_of("ks-big")))
    fresh = KeystoneHandler()
    before = unreadable(fresh.name)
    fresh.restore({"ks-big": state})
    assert unreadable(fresh.name) == before and "ks-big" in fresh.hosts


def test_the_lb_and_edge_stages_keep_no_state_to_restore() -> None:
    """The LB rates and the edge demand rebuild from telemetry after a start (nothing in the table or the data
    dir): no stored value of theirs can damage a restore. Checked here so that one that starts keeping state
    gets a fuzz test of its own."""
    for cls in (LbRates, DemandAggregator):
        assert not any(hasattr(cls, attr) for attr in ("restore", "restore_key", "state_of", "from_dict")), cls


def test_a_valid_state_round_trips_for_every_seed_of_the_schedules() -> None:
    """The checks refuse nothing a handler writes: the states of longer random runs restore without a refusal."""
    rng = random.Random(5)
    for name, kind in KINDS.items():
        handler = kind.make()
        with sim_clock(T0 + 86_400 * 3):
            for i in range(60):
                ts = T0 + kind.step_s * i + rng.uniform(0, 5)
                handler.handle([m for s in kind.sources for m in kind.rounds(s, ts, rng.randrange(20))], T0 + 86_400)
            states = {k: STATE_CODEC.loads(STATE_CODEC.dumps(v)) for k in handler_keys(handler)
                      if (v := handler.state_of(k)) is not None}
            fresh = kind.make()
            before = unreadable(fresh.name)
            with logged() as log:
                fresh.restore(states)
            assert unreadable(fresh.name) == before, (name, log.events("state_restore_failed"))
            assert states, name


# -------------------------------------------------------------------------- the real worker, the real changelog
@pytest.mark.integration
def test_a_worker_restores_past_a_torn_and_a_damaged_changelog_record(stack: Any, tmp_path: Any) -> None:
    """The real worker, Faust's recovery from the real changelog topic. Three hypervisors with an open port
    finding; the worker is killed; then hv-a's state gets a torn record (the last of its partition) and hv-c's a
    record whose open finding was first seen before 1970. The restarted worker refuses both (counted, their
    ports opened afresh), restores hv-b (not opened again) and handles every round. Before: the torn record
    raised inside Faust's recovery (skipped without a word, the older record of hv-a restored; the recovery
    waited for it until the watchdog skipped it as a gap), and hv-c's finding was taken as it was."""
    bootstrap = stack.kafka_bootstrap
    config, doc = detectors_config(tmp_path, stack)
    app_id, port = doc["stream"]["app_id"], doc["stream"]["metrics_port"]
    changelog = f"{app_id}-{STATE_TABLE}-changelog"
    hvs = {name: unique(name) for name in ("hv-a", "hv-b", "hv-c")}
    t0 = min(T0, time.time() - 7200)   # never ahead of the worker's clock (a sample's time, no assertion)
    rounds = [(Topic.IPTABLES, hv, iptables_round(hv, t0, {"p-open": False})) for hv in hvs.values()]

    worker = start_worker(tmp_path, config, doc, stack)
    try:
        produce(bootstrap, rounds)
        for hv in hvs.values():
            wait_until(lambda hv=hv: (s := state_in_changelog(bootstrap, app_id, f"firewall-detector|{hv}"))
                       and s["book"]["open"], timeout=90, what=f"state of {hv} in the changelog")
        # the rounds committed too (the changelog leads the first commit): no replay of them after the restart
        wait_until(lambda: committed_everything(bootstrap, app_id, [Topic.IPTABLES]), timeout=60,
                   what="the rounds' offsets committed")
    finally:
        worker.kill()

    records = {r.key: r for r in read_topic(bootstrap, changelog)}
    key_a, key_c = (orjson.dumps(f"firewall-detector|{hvs[n]}") for n in ("hv-a", "hv-c"))
    state_c = orjson.loads(records[key_c].value)
    next(iter(state_c["book"]["open"].values()))["first_seen"] = -1e13
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        producer.send(changelog, key=key_c, value=orjson.dumps(state_c), partition=records[key_c].partition)
        producer.send(changelog, key=key_a, value=records[key_a].value[:40], partition=records[key_a].partition)
        producer.flush()
    finally:
        producer.close()

    worker = start_worker(tmp_path, config, doc, stack)
    try:
        produce(bootstrap, [(Topic.IPTABLES, hv, iptables_round(hv, t0 + 600, {"p-open": False}))
                            for hv in hvs.values()])
        for hv in hvs.values():   # every round handled, the refused keys' included
            wait_until(lambda hv=hv: scrape_metric(port, "opsloop_firewall_report_timestamp_seconds",
                                                   {"hypervisor": hv}) == t0 + 600, timeout=90,
                       what=f"second round of {hv} handled")
        assert scrape_metric(port, "opsloop_stream_state_dropped_total",
                             {"handler": "firewall-detector", "reason": "unreadable"}) == 2.0
        opened = {name: [e for e, _ in findings_of(bootstrap, "firewall.unprotected_port", hypervisor=hv)]
                  .count("opened") for name, hv in hvs.items()}
        assert opened == {"hv-a": 2, "hv-b": 1, "hv-c": 2}, opened   # refused: afresh; restored: still open
        assert all(f.first_seen >= 0 for _, f in findings_of(bootstrap, "firewall.unprotected_port",
                                                             hypervisor=hvs["hv-c"]))
    finally:
        worker.stop()
