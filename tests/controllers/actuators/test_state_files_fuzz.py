"""The actuator's state files (controllers/actuators/store.py) valid in shape but holding adversarial values,
one field at a time, or torn at every byte offset; then the real service starts on them and runs a few steps.

Files: the weight history ``<listener>.jsonl``, ``<listener>.fail_static.json`` and (LVS, a quiescing
target) ``<listener>.unverified.json``. Values, written as raw JSON text: what orjson refuses (``1e400``,
``NaN``), huge and negative numbers, integers beyond 64 bits, times before 1970 or after 9999, epochs beyond
the year 9999 in ms, strings, bools, null, unicode, weights negative or above what the target takes,
thousands of origins, empty and huge lists, an entry's ``target`` naming the other kind of load balancer (the
entries up to it are set aside: not this target's weights).

Steps (``ActuatorService`` over an in-process HAProxy runtime and ``ipvsadm``, real clients): a tick (the
reconcile puts the stored weights back), the re-send of the last stamp the history holds (a controller
after the actuator's restart: ``noop``), a decision, the newest decision a controller can make
(``(now, MAX_VERSION)``: an epoch further ahead of the actuator's clock than ``max_clock_skew_s`` is refused, see
test_epoch_ahead.py), a later reconcile, an operator rollback, and a restart.

The property: either the file is refused, naming it (the history: its line and field, the slot ``held``,
nothing written; the fail-static file: logged and counted, the slot open since now), or its values are used
and the decisions apply; never an internal error (an exception out of a step), never a batch with a weight
outside what the target takes (or nothing serving) handed to a load balancer, never a finding with a
``first_seen`` no alert can carry, never a finding state dropped while the broker takes every send.

What failed before the store checked ranges (each kept as an example below):

* an epoch of 2**63 - 1 in the history: every decision ``stale_version`` for good, the file not named;
* a weight of -5: every reconcile wrote the others then the -5 was refused and the batch undone (a write and
  an undo on the LB every ``reconcile_interval_s``, for good); 1000 on HAProxy: refused on every reconcile;
* 3000 origins in the last entry: the controller's re-send (``noop``) raised ``AuditError`` (no audit record
  holds them) on every attempt;
* ``applied_at`` 1e20: ``weights history`` died in ``OverflowError`` (see the CLI test);
* ``since`` -1e13 (or an owed clear of -1e13) in the fail-static file: the restated finding carried it;
  5000 owed clears: 4968 ``finding_dropped`` errors at start; a damaged file was not counted;
* a ``cleared`` of ``"5"`` (or 1, null, a list): read as open without a word, the only field not named and counted.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from opsloop.audit.trail import AuditLog
from opsloop.records import EdgeWeights, Finding

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.config import ActuatorConfig
from opsloop.controllers.actuators.haproxy import HaproxyTarget
from opsloop.controllers.actuators.mapping import to_integer_weights
from opsloop.controllers.actuators.service import ActuatorService
from opsloop.controllers.actuators.store import StoreError, WeightStore
from tests.controllers.actuators.support import ListSink
from tests.controllers.actuators.test_schedule_faults import FakeLvs, FakeRuntime
from tests.helpers import captured_logs, run_cli, unique, write_config

# the ranges of store.py (LAST_EPOCH, LAST_TIME_S, MAX_VERSION), spelt out: these tests run on the store before them
LAST_EPOCH = 253_402_300_799_999      # 9999-12-31T23:59:59.999Z in ms: the last epoch a controller can take
LAST_TIME = 253_402_300_799.0         # 9999-12-31T23:59:59Z: the last second an alert's time can hold
MAX_VERSION = 2 ** 63 - 1             # what `weights rollback --to` takes
ORIGINS = ("a", "b")
E0, E1 = 1_700_000_000_000, 1_790_000_000_000     # epochs (ms) of the history's entries and of the decisions
T_STORED = 1_700_000_000.0
HISTORY = [{"version": v, "epoch": E0, "weights": {"a": 128, "b": 128}, "shares": {"a": 0.5, "b": 0.5},
            "decision": {"a": 0.5, "b": 0.5}, "complete": True, "action": "apply", "applied_at": T_STORED + v,
            "computed_at": T_STORED + v - 1, "reason": f"v{v}"} for v in (1, 2, 3)]
FAIL_STATIC = {"since": T_STORED + 50, "owed": [T_STORED + 10]}
UNVERIFIED = {"zeroed": ["b"], "weights": {"a": 100, "b": 0}, "at": T_STORED + 20}
FIELDS = {"history": [*HISTORY[0], "target"], "fail_static": ["since", "cleared", "owed"],
          "unverified": ["zeroed", "weights", "at"]}
HOLE = orjson.dumps("\u0000hole")   # where the raw value goes (a string no field holds)



class Raw(str):
    """Raw JSON text shown by a name (a falsifying example of 100 kB says nothing)."""

    def __new__(cls, text: str, name: str) -> "Raw":
        raw = super().__new__(cls, text)
        raw.name = name   # type: ignore[attr-defined]
        return raw

    def __repr__(self) -> str:
        return self.name   # type: ignore[attr-defined]


MANY = Raw("{" + ",".join(f'"o{i:05d}": 1' for i in range(3000)) + "}", "MANY")
OWED_5000 = Raw("[" + ",".join(str(T_STORED + i) for i in range(5000)) + "]", "OWED_5000")
LONG = Raw('"' + "x" * 100_000 + '"', "LONG")
SCALARS = ["1e400", "-1e400", "NaN", "Infinity", "1e300", "-1e300", "-1e13", "1e13", "1e20", "-1", "0", "1.5",
           "253402300799", "253402300800", "253402300799999", "253402300800000", "9223372036854775807",
           "9223372036854775808", "18446744073709551615", "18446744073709551616", "-9223372036854775809",
           '"5"', '""', '"lvs"', '"haproxy"', "true", "false", "null", "[]", "{}", '"\\u00e9\\u2603\\ud83d\\ude00"',
           LONG]
MAPPINGS = ['{"a": -5, "b": 128}', '{"a": 1000, "b": 1}', '{"a": 65536, "b": 1}', '{"a": 0.5, "b": 0.5}',
            '{"a": 0.7, "b": 0.7}', '{"a": -0.5, "b": 1.5}', '{"a": 0, "b": 0}', '{"zz": 7}', '{"": 5}',
            '{"\\u00e9": 3, "a": 1}', '{"a": 1e400}', '{"a": "1"}', '{"a": true, "b": 1}', MANY]
LISTS = ["[-1e13]", "[1e20]", "[0]", '["x"]', "[null]", "[true]", "[1e400]", '["a", 5]', '["zz", "\\u00e9"]',
         OWED_5000, "[1795000000.0, 1795000000.0]"]
RAW = st.one_of(st.sampled_from(SCALARS + MAPPINGS + LISTS),
                st.integers(-2 ** 70, 2 ** 70).map(str),
                st.floats(allow_nan=False, allow_infinity=False).map(lambda f: orjson.dumps(f).decode()))


def json_doc(doc: dict[str, Any], name: str | None, raw: str) -> bytes:
    """``doc`` as JSON with ``raw`` (JSON text, valid or not) as the value of ``name``."""
    if name is None:
        return orjson.dumps(doc)
    out = orjson.dumps({**doc, name: "\u0000hole"}).replace(HOLE, raw.encode("utf-8", "surrogatepass"))
    assert HOLE not in out and raw.encode("utf-8", "surrogatepass") in out
    return out


def history_bytes(line: int | None = None, name: str | None = None, raw: str = "") -> bytes:
    return b"".join(json_doc(e, name if i == line else None, raw) + b"\n" for i, e in enumerate(HISTORY))


# -- the service, its load balancers, its broker --------------------------------------------------------------
class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes = b"") -> None:
        self.sent.append((topic, value))

    def close(self) -> None:
        pass


@dataclass
class Rig:
    tmp: Path
    edge: str
    writes: list[tuple[str, int, dict[str, int]]] = field(default_factory=list)   # (listener, max weight, batch)
    producer: Producer = field(default_factory=Producer)
    sink: ListSink = field(default_factory=ListSink)
    lbs: dict[str, Any] = field(default_factory=dict)

    def config(self) -> ActuatorConfig:
        return ActuatorConfig(stale_after_s=600.0, store_dir=self.tmp, max_step=1.0, reconcile_interval_s=30.0,
                              backoff_initial_s=0.01, backoff_max_s=0.01, targets=[
                                  {"edge": self.edge, "listener": "web", "kind": "haproxy",
                                   "socket": str(self.tmp / "none.sock"), "backend": "be",
                                   "servers": {o: o for o in ORIGINS}},
                                  {"edge": self.edge, "listener": "app", "kind": "lvs",
                                   "service": "tcp:192.0.2.10:443",
                                   "reals": {o: f"10.0.0.{i + 1}:443" for i, o in enumerate(ORIGINS)}}])

    def start(self) -> ActuatorService:
        """The real service on the store (its real constructor reads the state files), its targets in process."""
        cfg = self.config()
        svc = ActuatorService(cfg, "127.0.0.1:1", [self.edge], AuditLog([self.sink]), consumer=object(),
                              producer=self.producer)
        if not self.lbs:
            live = {o: 100 for o in ORIGINS}
            self.lbs = {"web": FakeRuntime(live), "app": FakeLvs(cfg.targets[1], live)}
        for t in cfg.targets:
            act = svc.slots[(t.listener, self.edge)].actuator
            target = HaproxyTarget(t, api=self.lbs["web"]) if t.kind == "haproxy" else self.lbs["app"]
            real_write = target.write

            def write(weights: dict[str, int], listener: str = t.listener, target: Any = target,
                      real_write: Any = real_write) -> None:
                self.writes.append((listener, target.max_weight, dict(weights)))
                real_write(weights)

            target.write = write
            act.target = target
        return svc

    def store(self, listener: str) -> WeightStore:
        """The slot's files (the service's own store object says what loads: it knows the target)."""
        return WeightStore(self.tmp, self.edge, listener)

    def counter(self, kind: str) -> float:
        return metrics.ERRORS.labels(self.edge, kind)._value.get()

    def decision(self, listener: str, epoch: int, version: int, shares: dict[str, float]) -> tuple[bytes, bytes]:
        d = EdgeWeights(version=version, epoch=epoch, listener=listener, edge=self.edge, weights=shares,
                        computed_at=time.time(), reason="fuzz")
        return f"{listener}|{self.edge}".encode(), d.encode()

    def results(self, listener: str) -> list[Any]:
        return [r for r in self.sink.records if r.listener == listener]

    def forget(self) -> None:
        """Drop this rig's weight gauges: each publish walks every child (thousands of examples made it slow)."""
        for listener in ("web", "app"):
            for origin in ORIGINS:
                try:
                    metrics.WEIGHT.remove(self.edge, listener, origin)
                except KeyError:
                    pass


def loaded(store: WeightStore) -> list[Any] | StoreError:
    try:
        return store.history()
    except StoreError as e:
        return e


def check_writes(rig: Rig) -> None:
    for listener, top, batch in rig.writes:
        assert all(isinstance(w, int) and 0 <= w <= top for w in batch.values()), (listener, batch)
        assert sum(batch.values()) > 0, (listener, batch)


def check_findings(rig: Rig) -> None:
    for topic, value in rig.producer.sent:
        if topic.endswith("findings"):
            f = Finding.decode(value)
            assert 0 < f.first_seen <= LAST_TIME and 0 < f.last_seen <= LAST_TIME, (f.first_seen, f.last_seen)


def run_steps(rig: Rig, field_name: str | None = None) -> None:
    """Start the service, run the steps of the module docstring, check the property."""
    svc = rig.start()
    t0 = time.monotonic()
    stores = {lst: svc.slots[(lst, rig.edge)].actuator.store for lst in ("web", "app")}
    histories = {lst: loaded(s) for lst, s in stores.items()}
    shares = {"a": 0.25, "b": 0.75}
    svc.tick(t0)                                                       # reconcile: the stored weights put back
    for listener, h in histories.items():                              # the controller re-sends what was applied
        last = h[-1] if isinstance(h, list) and h else None
        if last is not None and 0 <= last.version and 0 <= last.epoch:   # what a decision can carry
            svc.handle_records([rig.decision(listener, last.epoch, last.version, {"a": 0.5, "b": 0.5})])
    svc.tick(t0 + 1)
    svc.handle_records([rig.decision(lst, E1, 10, shares) for lst in ("web", "app")])
    svc.tick(t0 + 2)
    mark = len(rig.sink.records)
    newest = int(time.time() * 1000)   # a controller started now: no later epoch is taken (ahead of the clock)
    svc.handle_records([rig.decision(lst, newest, MAX_VERSION, shares) for lst in ("web", "app")])
    svc.tick(t0 + 3)
    newest = rig.sink.records[mark:]
    svc.tick(t0 + 40)                                                  # a later reconcile
    assert rig.counter("internal") == 0, "a step raised"
    check_writes(rig)
    check_findings(rig)
    for listener, h in histories.items():
        store, lb = stores[listener], rig.lbs[listener]
        audited = rig.results(listener)
        if isinstance(h, StoreError):
            # refused: named (file, line, field), the slot holds what is live, nothing written to its LB
            assert str(store.path) in str(h) and " line " in str(h), str(h)
            assert field_name is None or field_name in str(h), str(h)
            assert not [w for w in rig.writes if w[0] == listener]
            decided = [r for r in audited if r.action == "edge.weights.apply"]
            assert decided and all(r.result == "held" and str(store.path) in r.reason for r in decided)
            assert metrics.FAIL_STATIC.labels(listener, rig.edge)._value.get() == 1
        else:
            # used: every entry is one `weights history` prints, and the newest decision a controller can make
            # applies (a history holding a stamp beyond it left the slot refusing every decision for good)
            for e in h:
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.applied_at))
            final = [r for r in newest if r.listener == listener and r.action == "edge.weights.apply"]
            assert [r.result for r in final] == ["applied"], [(r.result, r.reason) for r in audited]
            total = 256 if listener == "web" else 10_000
            assert lb.weights == to_integer_weights(shares, total)
    # an operator's rollback, then a restart on what the steps left
    for listener in ("web", "app"):
        act = svc.slots[(listener, rig.edge)].actuator
        to = next((e.version for e in reversed(histories[listener]) if e.version != MAX_VERSION), None) \
            if isinstance(histories[listener], list) else 2
        try:
            act.rollback(to)
        except StoreError as e:
            assert str(stores[listener].path) in str(e)
    again = rig.start()
    again.tick(time.monotonic())
    assert rig.counter("internal") == 0, "a step raised after the restart"
    check_writes(rig)
    check_findings(rig)
    for listener in ("web", "app"):   # the broker took every send: nothing had to be dropped
        assert metrics.FINDINGS_DROPPED.labels(rig.edge, listener)._value.get() == 0, listener


def date_ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= LAST_TIME


def fail_static_ok(raw: bytes) -> bool:
    """What the service may use as it is (else it must say the file is damaged)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    owed = doc.get("owed", []) if isinstance(doc, dict) else None
    return isinstance(doc, dict) and date_ok(doc.get("since")) and isinstance(owed, list) \
        and all(date_ok(x) for x in owed) and len(owed) <= 31 and isinstance(doc.get("cleared", False), bool)


def run_case(file: str, name: str | None, raw: str, line: int = 2) -> None:
    with tempfile.TemporaryDirectory() as tmp, captured_logs() as logs:
        rig = Rig(Path(tmp), unique("fz"))
        for listener in ("web", "app"):
            store = rig.store(listener)
            store.path.parent.mkdir(parents=True, exist_ok=True)
            store.path.write_bytes(history_bytes(line, name, raw) if file == "history" else history_bytes())
            fs = json_doc(FAIL_STATIC, name, raw) if file == "fail_static" else None
            if fs is not None:
                store.fail_static_path.write_bytes(fs)
            if file == "unverified" and listener == "app":
                store.unverified_path.write_bytes(json_doc(UNVERIFIED, name, raw))
        named = None
        if file == "history":
            try:   # a line that is no JSON any more cannot name the field
                orjson.loads(history_bytes(line, name, raw).splitlines()[line])
                named = name
            except orjson.JSONDecodeError:
                pass
        try:
            run_steps(rig, named)
        finally:
            rig.forget()
        if file == "fail_static" and not fail_static_ok(fs or b""):
            path = str(rig.store("web").fail_static_path)
            assert rig.counter("store") >= 2, "a damaged fail-static file is counted (one per slot)"
            assert any(path in line and "fail_static_state" in line for line in logs.lines), logs.lines[:5]


CASES = [(file, name) for file, names in sorted(FIELDS.items()) for name in names]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), line=st.integers(0, 2), raw=RAW)
@example(case=("history", "epoch"), line=2, raw="9223372036854775807")     # every decision refused for good
@example(case=("history", "weights"), line=2, raw='{"a": -5, "b": 128}')   # a write and its undo each reconcile
@example(case=("history", "weights"), line=2, raw='{"a": 1000, "b": 1}')   # above what HAProxy takes
@example(case=("history", "weights"), line=2, raw=MANY)                    # no audit record holds the noop
@example(case=("history", "applied_at"), line=2, raw="1e20")               # `weights history` died
@example(case=("fail_static", "since"), line=0, raw="-1e13")               # restated in the finding
@example(case=("fail_static", "owed"), line=0, raw="[-1e13]")              # its clear too
@example(case=("fail_static", "owed"), line=0, raw=OWED_5000)              # 4968 states dropped at start
@example(case=("fail_static", "cleared"), line=0, raw='"5"')              # read as open, neither named nor counted
@example(case=("history", "target"), line=1, raw='"lvs"')                 # HAProxy's slot: entries set aside
def test_a_state_file_with_any_value_in_a_field_is_refused_by_name_or_used(case: tuple[str, str], line: int,
                                                                           raw: str) -> None:
    run_case(*case, raw, line)


@pytest.mark.parametrize("file", sorted(FIELDS))
def test_a_state_file_torn_at_every_byte_offset(file: str) -> None:
    """A torn history is its complete lines (the tail is ignored), a torn fail-static or unverified file is
    unreadable (open since now; every 0 may be ours): the slots go on either way."""
    whole = {"history": history_bytes(), "fail_static": orjson.dumps(FAIL_STATIC),
             "unverified": orjson.dumps(UNVERIFIED)}[file]
    for cut in range(len(whole) + 1):
        with tempfile.TemporaryDirectory() as tmp:
            rig = Rig(Path(tmp), unique("torn"))
            for listener in ("web", "app"):
                store = rig.store(listener)
                store.path.parent.mkdir(parents=True, exist_ok=True)
                target = {"history": store.path, "fail_static": store.fail_static_path,
                          "unverified": store.unverified_path}[file]
                if file != "history":
                    store.path.write_bytes(history_bytes())
                target.write_bytes(whole[:cut])
            try:
                run_steps(rig)
            finally:
                rig.forget()
            assert all(isinstance(loaded(rig.store(lst)), list) for lst in ("web", "app"))


@pytest.mark.parametrize("damage", [{"version": 2 ** 64 - 1}, {"version": -1}, {"epoch": 2 ** 63 - 1},
                                    {"epoch": -1}, {"weights": {"near": -5, "far": 128}},
                                    {"weights": {"near": 70_000, "far": 1}}, {"applied_at": 1e20},
                                    {"applied_at": -1e13}, {"computed_at": 1e13}],
                         ids=lambda d: f"{next(iter(d))}={next(iter(d.values()))}")
def test_the_cli_names_file_line_and_field_of_a_value_no_apply_writes(tmp_path: Path, damage: dict[str, Any]) -> None:
    """`weights history` died in ``OverflowError`` on applied_at 1e20 and printed the year -314918 for -1e13; it
    listed a version `weights rollback --to` refuses to take (2**64 - 1, -1). One line naming file, line and field."""
    store = WeightStore(tmp_path / "store", "e1", "web")
    good = {"version": 1, "epoch": 0, "weights": {"near": 128, "far": 128}, "shares": {"near": 0.5, "far": 0.5},
            "decision": {"near": 0.5, "far": 0.5}, "applied_at": 1795400000.0}
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(orjson.dumps(good) + b"\n" + orjson.dumps({**good, "version": 2, **damage}) + b"\n")
    cfg = write_config(tmp_path / "c.yaml", {"controllers": {"actuator": {"store_dir": str(tmp_path / "store"),
        "targets": [{"edge": "e1", "listener": "web", "kind": "lvs", "service": "tcp:192.0.2.10:443",
                     "reals": {"near": "10.0.0.1:443", "far": "10.0.0.2:443"}}]}}})
    r = run_cli("weights", "history", "--edge", "e1", "--config", str(cfg))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, (r.stdout[-500:], r.stderr[-1500:])
    assert f"{store.path} line 2: not a history entry" in lines[0] and next(iter(damage)) in lines[0], lines[0]


def test_a_decision_beyond_what_the_history_keeps_is_refused_before_any_write(tmp_path: Path) -> None:
    """A decision valid to the schema but with an epoch beyond the year 9999 in ms (a controller that recovered
    garbage) was applied and stored: every decision after it was ``stale_version``, for good (the history then
    holds what the store refuses, see above). Such a record is refused at decode now (the record's own ranges,
    opsloop/records/edge.py): counted, dead-lettered with the field named, nothing written; one built past
    validation (a controller bug) is refused by the applier. The controller's next decision applies."""
    rig = Rig(tmp_path, unique("far"))
    svc = rig.start()
    t0 = time.monotonic()
    good = orjson.loads(rig.decision("web", E1, 1, {"a": 0.5, "b": 0.5})[1])
    far = [(0, 2 ** 64 - 1), (0, MAX_VERSION + 1), (LAST_EPOCH + 1, 1), (2 ** 64 - 1, 1)]
    rejected = metrics.REJECTED._value.get()
    for i, (epoch, version) in enumerate(far):
        raw = orjson.dumps({**good, "epoch": epoch, "version": version})
        svc.handle_records([(f"web|{rig.edge}".encode(), raw)], [(0, i)])
        svc.tick(t0 + i)
    assert metrics.REJECTED._value.get() - rejected == len(far)
    dead = [orjson.loads(v) for topic, v in rig.producer.sent if "deadletter" in topic]
    assert [d["offset"] for d in dead] == list(range(len(far)))
    assert ["version" in d["reason"] for d in dead] == [True, True, False, False], [d["reason"] for d in dead]
    assert ["epoch" in d["reason"] for d in dead] == [False, False, True, True], [d["reason"] for d in dead]
    for epoch, version in far:   # past validation: the applier's own check
        act = svc.slots[("web", rig.edge)].actuator
        res = act.apply(EdgeWeights.model_construct(**{**EdgeWeights.decode(orjson.dumps(good)).__dict__,
                                                       "epoch": epoch, "version": version}))
        assert res.result == "refused" and "beyond what a decision carries" in res.reason, (res.result, res.reason)
    assert rig.counter("internal") == 0 and rig.writes == [] and loaded(rig.store("web")) == []
    svc.handle_records([rig.decision("web", E1, 1, {"a": 0.25, "b": 0.75})])
    svc.tick(t0 + 5)
    assert rig.results("web")[-1].result == "applied" and rig.lbs["web"].weights == {"a": 64, "b": 192}
