"""Fuzzed garbage on the findings topic (hypothesis, no broker): the paging actuator's record handling
never raises, dead-letters exactly the records that are not findings (with their origin and reason),
counts them, and still acts on the valid findings mixed in between."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsloop.controllers.paging import metrics
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from opsloop.records import Finding, Severity
from opsloop.topics import Topic

T0 = 1_795_310_400.0


class RecordingProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, bytes]] = []

    def send(self, topic: str, key: Any = None, value: bytes = b"") -> None:
        self.sent.append((topic, key, value))

    def flush(self, timeout: float | None = None) -> None:
        pass


def valid_finding(i: int) -> bytes:
    return Finding(detector="firewall.unprotected_port", what="VM port without its security-group chain",
                   where={"hypervisor": f"hv-{i}", "port": "p1"}, observed="chain absent", expected="chain present",
                   severity=Severity.CRITICAL, explanation="fuzz", first_seen=T0, last_seen=T0).encode()


json_values = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
                           | st.integers(-(2**63), 2**63 - 1) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=12)
# Garbage: random bytes, random JSON, and valid findings with one field replaced by a random JSON value.
finding_keys = list(orjson.loads(valid_finding(0)).keys())
damaged = st.builds(lambda k, v: orjson.dumps({**orjson.loads(valid_finding(0)), k: v}),
                    st.sampled_from(finding_keys), json_values)


def not_a_finding(raw: bytes) -> bool:
    try:
        Finding.decode(raw)
    except ValueError:
        return True
    return False


# (A damaged record that still decodes, e.g. another ``explanation`` text, is a finding, not garbage.)
garbage = (st.binary(max_size=300) | json_values.map(orjson.dumps) | damaged).filter(not_a_finding)
records = st.lists(st.one_of(garbage, st.integers(0, 5).map(valid_finding)), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=records)
def test_garbage_is_deadlettered_counted_and_findings_still_act(values: list[bytes], tmp_path: Path) -> None:
    producer = RecordingProducer()
    svc = PagingService(PagingConfig(state_file=tmp_path / "state.json", start_offset="latest"), "127.0.0.1:1",
                        consumer=object(), producer=producer)  # type: ignore[arg-type]
    svc.auditor.producer = producer
    rejected_before = metrics.REJECTED._value.get()
    origins = [(i % 4, 1000 + i, f"k{i}".encode()) for i in range(len(values))]

    actions = svc.handle_records(values, time.time(), origins)

    bad = [i for i, v in enumerate(values) if not_a_finding(v)]
    deadletters = [orjson.loads(v) for t, _, v in producer.sent if t == Topic.DEADLETTER.value]
    assert len(deadletters) == len(bad)
    assert metrics.REJECTED._value.get() - rejected_before == len(bad)
    for i, dl in zip(bad, deadletters):
        assert dl["source_topic"] == "findings" and dl["stage"] == "paging" and dl["reason"]
        assert (dl["partition"], dl["offset"], dl["key"]) == (i % 4, 1000 + i, f"k{i}")
    # Each distinct valid finding opened exactly one alert, whatever garbage surrounded it.
    valid_ids = {Finding.decode(v).id for i, v in enumerate(values) if i not in bad}
    assert {a.finding_id for a in actions if a.kind == "open"} == valid_ids
    assert len(svc.book.open) == len(valid_ids)
