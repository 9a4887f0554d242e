"""A finding's ``first_seen``/``last_seen`` are times from 1970 to the end of 9999 (opsloop.validation's bound,
the one of every saved time): before, any float was a finding's time, and the paging actuator paged one from
before 1970 as starting then (a start before the year 1000, the year 68: Alertmanager refused it)."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opsloop.records import Finding, RecordError
from opsloop.records.metric import MAX_TIMESTAMP, MIN_TIMESTAMP
from opsloop.validation import LAST_TIME_S, is_time

T0 = 1_795_310_400.0


def finding(**times: float) -> Finding:
    return Finding(detector="firewall.unprotected_port", what="VM port without its security-group chain",
                   where={"hypervisor": "hv-3"}, **{"first_seen": T0, "last_seen": T0, **times})


def wire(**times: float) -> bytes:
    return orjson.dumps({**orjson.loads(finding().encode()), **times})


@pytest.mark.parametrize("value", [0.0, 0, 1.5, T0, LAST_TIME_S, int(LAST_TIME_S)])
@pytest.mark.parametrize("field", ["first_seen", "last_seen"])
def test_times_from_1970_to_the_end_of_9999_are_taken(field: str, value: float) -> None:
    f = Finding.decode(wire(**{field: value}))
    assert getattr(f, field) == value and Finding.decode(f.encode()) == f


@pytest.mark.parametrize("value,why", [
    (-6e10, "before 1970"),                      # the year 68: paged as starting then
    (-1.0, "before 1970"),
    (LAST_TIME_S + 1, "after the year 9999 (milliseconds?)"),
    (1.7e12, "after the year 9999 (milliseconds?)"),   # a producer writing milliseconds
    (1e300, "after the year 9999"),
])
@pytest.mark.parametrize("field", ["first_seen", "last_seen"])
def test_a_record_beyond_is_refused_at_decode_naming_the_field(field: str, value: float, why: str) -> None:
    with pytest.raises(RecordError) as e:
        Finding.decode(wire(**{field: value}))
    assert str(e.value) == (f"finding: {field}: {why}: expected seconds since the epoch, from 1970 to the end "
                            f"of 9999 (got {value!r})")


def test_every_bad_time_is_named_in_one_error() -> None:
    with pytest.raises(RecordError, match=r"^finding: first_seen: before 1970: .*; last_seen: after the year 9999"):
        Finding.decode(wire(first_seen=-1, last_seen=1e13))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_time_that_is_no_number_is_refused_where_it_is_built(value: float) -> None:
    """No JSON carries NaN or infinity; a producer in Python can: refused where it builds the record."""
    with pytest.raises(ValidationError, match="last_seen\n.*not a finite number"):
        finding(last_seen=value)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2 ** 60, 2 ** 60))
def test_a_finding_time_is_exactly_what_is_time_takes(value: float) -> None:
    """The paging book's saved times and the stream states use the same bound: what a finding carries, its
    consumers can save and load back."""
    try:
        finding(first_seen=value, last_seen=value)
    except ValidationError:
        assert not is_time(value)
    else:
        assert is_time(value)


@settings(max_examples=200, deadline=None)
@given(st.floats(MIN_TIMESTAMP, MAX_TIMESTAMP), st.floats(MIN_TIMESTAMP, MAX_TIMESTAMP))
def test_a_detector_stamping_sample_times_always_builds_its_finding(first: float, now: float) -> None:
    """Detectors stamp findings with sample times (the telemetry record's 2000..2100), as the finding book
    does (``last_seen = max(now, first_seen)``): never a time the record refuses, so a sample never raises."""
    assert 0 <= MIN_TIMESTAMP <= MAX_TIMESTAMP <= LAST_TIME_S
    f = finding(first_seen=first, last_seen=max(now, first))
    assert f.model_copy(update={"cleared": True}).encode()


def test_first_seen_after_last_seen_is_still_a_finding() -> None:
    """Not refused: the weight actuators date their fail-static finding by the wall clock, which can step back
    between its first and a later record (the paging book orders records by last_seen, then first_seen)."""
    assert Finding.decode(wire(first_seen=T0 + 60, last_seen=T0)).first_seen == T0 + 60
