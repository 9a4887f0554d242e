"""Every derived topic's record decoder under a poison record: each field of a valid record replaced by anything
JSON holds (a bool, an int beyond 64 bits, a huge or odd string, a nested value), fields dropped, an ``id`` or
``schema_version`` added. A decoder either raises RecordError (the consumer dead-letters it with that reason) or
returns a record a consumer can use: its id, key and encoding work and the encoding decodes to the same record.
Nothing else may escape: a consumer that meets another exception stops on that record.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsloop.records import AuditRecord, EdgeDemand, EdgeWeights, Finding, JsonRecord, RecordError

_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.integers(0, 2 ** 64),
    st.floats(allow_nan=False, allow_infinity=False), st.floats(0, 1), st.floats(1e9, 4e9),
    st.text(max_size=30), st.text(max_size=2000).map(lambda t: t * 3),
    st.sampled_from(["normal", "shed", "dry-run", "live", "warning", "a.b", "", "2026-01-01T00:00:00Z",
                     "http://user:pw@host/", "1795310400", "\n", "\x00", "\u2028"]))
_VALUES = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)

VALID: dict[type[JsonRecord], dict[str, Any]] = {
    Finding: {"detector": "a.b", "what": "w", "where": {"host": "h"}, "observed": 1.0, "expected": 2,
              "score": 0.5, "severity": "warning", "explanation": "e", "first_seen": 1.7e9, "last_seen": 1.7e9,
              "cleared": False, "runbook": "", "dashboard": ""},
    EdgeDemand: {"edge": "e", "backend": "b", "demand_rps": 1.0,
                 "origins": {"o": {"rps": 1.0, "up": True, "status": "UP", "rtime_ms": 3}}, "timestamp": 1.7e9},
    EdgeWeights: {"version": 3, "epoch": 1, "listener": "l", "edge": "e", "weights": {"a": 0.5, "b": 0.5},
                  "computed_at": 1.7e9, "mode": "normal", "reason": "r", "inputs_age_s": 0.0, "shed": {"rps": 1.0}},
    AuditRecord: {"time": 1.7e9, "actor": "a.b", "action": "c.d", "target": "t", "edge": "e", "listener": "l",
                  "version": 3, "before": {"a": 1}, "after": {"a": 2}, "reason": "r", "mode": "live",
                  "result": "applied", "error": None, "labels": {"k": "v"}},
}


def _usable(record: JsonRecord) -> None:
    """What consumers do with a decoded record."""
    again = type(record).decode(record.encode())
    if isinstance(record, (Finding, AuditRecord)):
        assert again.id == record.id
    if isinstance(record, EdgeDemand):
        assert record.key
    if isinstance(record, AuditRecord):
        record.document()
        assert again == record


@pytest.mark.parametrize("cls", list(VALID), ids=lambda c: c.__name__)
def test_a_poison_record_is_refused_with_a_record_error_or_decodes_usable(cls: type[JsonRecord]) -> None:
    names = sorted(VALID[cls])
    _usable(cls.decode(orjson.dumps(VALID[cls])))

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from([*names, "id", "schema_version"]), _VALUES, max_size=3),
           st.lists(st.sampled_from(names), max_size=2))
    def check(changed: dict[str, Any], dropped: list[str]) -> None:
        doc = {**VALID[cls], **changed}
        for name in dropped:
            doc.pop(name, None)
        try:
            raw = orjson.dumps(doc)
        except orjson.JSONEncodeError:   # an int beyond 64 bits, which orjson does not write: JSON has it
            raw = json.dumps(doc).encode()
        try:
            record = cls.decode(raw)
        except RecordError as e:
            assert str(e).startswith(f"{cls.RECORD}: ")   # names the record; the field follows
            return
        _usable(record)

    check()
