"""Parsers of the Keystone collector: uWSGI request log, nginx s3_keystone log, uWSGI stats, SigV4.

Recorded inputs come from collectors/keystone/testdata (captured from the real uWSGI, nginx and
Keystone on this machine); hypothesis fuzzes every parser: bad input raises the parser's own
error (a ValueError naming what was wrong), never anything else.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.collectors.keystone import nginx_log, sigv4, uwsgi_log, uwsgi_stats
from opsloop.collectors.keystone.latency import percentile, summarize
from tests.helpers import REPO

TESTDATA = REPO / "collectors" / "keystone" / "testdata"
FUZZ = settings(max_examples=300, deadline=None)


# --- uWSGI request log -------------------------------------------------------------------------
def test_recorded_opsloop_format_lines_all_parse_with_timing():
    lines = (TESTDATA / "uwsgi-access.log").read_text().splitlines()
    records = [uwsgi_log.parse_line(line) for line in lines]
    assert len(records) == len(lines) > 10
    endpoints = {r.endpoint for r in records}
    assert "/v3/s3tokens" in endpoints and "/v3/auth/tokens" in endpoints
    # the recorded GET on a concrete user id is reported under a template, not per id
    assert "/v3/users/{id}" in endpoints
    assert all(r.msecs >= 0 and 100 <= r.status <= 599 for r in records)
    assert any(r.status == 401 for r in records)


def test_recorded_stock_uwsgi_lines_parse():
    records = [uwsgi_log.parse_line(line) for line in (TESTDATA / "uwsgi-access-stock.log").read_text().splitlines()]
    assert [(r.method, r.endpoint, r.status) for r in records] == [
        ("GET", "/v3/auth/tokens", 200), ("GET", "/v3/users/{id}", 200)]


@pytest.mark.parametrize("uri, endpoint", [
    ("/v3/auth/tokens", "/v3/auth/tokens"),
    ("/v3/users/6f0e2b1c9d8a4e7f8b6c5d4e3f2a1b0c/projects?domain=x", "/v3/users/{id}/projects"),
    ("/v3/projects/123", "/v3/projects/{id}"),
    ("/v3/roles/b5829c4e-e01f-4b3f-9d42-bcd80b71af39", "/v3/roles/{id}"),
    ("", "/"),
])
def test_endpoint_templates(uri, endpoint):
    assert uwsgi_log.endpoint_of(uri) == endpoint


@pytest.mark.parametrize("line, needle", [
    ("uwsgi_req ts_ms=1 method=GET uri=/v3 status=xx msecs=1 rsize=1 pid=1", "malformed field"),
    ("uwsgi_req ts_ms=1 method=GET uri=/v3 status=999 msecs=1 rsize=1 pid=1", "not an HTTP status"),
    ("[pid: 1|app: 0|req: 1/1] 1.2.3.4 () {1 vars in 2 bytes} [Bogus time] GET / => generated 2 bytes in 0 msecs "
     "(HTTP/1.1 200)", "bad request time"),
    ("Sun Nov 22 02:35:17 2026 - *** uWSGI is running in multiple interpreter mode ***", "not a uWSGI request line"),
])
def test_uwsgi_bad_lines_say_what_is_wrong(line, needle):
    with pytest.raises(uwsgi_log.LogParseError, match=needle):
        uwsgi_log.parse_line(line)


@FUZZ
@given(st.text(max_size=400))
def test_uwsgi_parser_never_crashes(text):
    try:
        rec = uwsgi_log.parse_line(text)
    except uwsgi_log.LogParseError as e:
        assert str(e)
    else:
        assert 100 <= rec.status <= 599


uri_segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12)


@FUZZ
@given(ts=st.integers(946684800000, 4102444800000), method=st.sampled_from(["GET", "POST", "HEAD", "DELETE"]),
       segments=st.lists(uri_segment, max_size=5), status=st.integers(100, 599), msecs=st.integers(0, 10**7),
       rsize=st.integers(0, 10**9), pid=st.integers(1, 4 * 10**6))
def test_uwsgi_opsloop_format_roundtrip(ts, method, segments, status, msecs, rsize, pid):
    uri = "/" + "/".join(segments)
    line = (uwsgi_log.LOGFORMAT.replace("%(tmsecs)", str(ts)).replace("%(method)", method)
            .replace("%(uri)", uri).replace("%(status)", str(status)).replace("%(msecs)", str(msecs))
            .replace("%(rsize)", str(rsize)).replace("%(pid)", str(pid)).replace("%(addr)", "127.0.0.1"))
    rec = uwsgi_log.parse_line(line)
    assert (rec.timestamp, rec.method, rec.status, rec.msecs, rec.rsize) == (ts / 1000, method, status, msecs, rsize)
    assert rec.endpoint == uwsgi_log.endpoint_of(uri)


# --- nginx s3_keystone log ---------------------------------------------------------------------
def test_recorded_nginx_lines_parse_with_keys_sizes_and_timing():
    records = [nginx_log.parse_line(line) for line in (TESTDATA / "nginx-s3-access.log").read_text().splitlines()]
    assert len(records) == 13
    anonymous = [r for r in records if r.access_key is None]
    assert len(anonymous) == 1 and anonymous[0].body_bytes_sent == 120
    large = [r for r in records if not r.is_small()]
    assert len(large) == 2 and all(r.body_bytes_sent == 100000 for r in large)
    assert {r.status for r in records} == {200, 403}
    # the presigned request (key id only in the query string) is attributed to its key too
    presigned = records[-1]
    assert presigned.access_key == records[2].access_key and presigned.request_length < 300


def test_small_request_needs_both_sizes_below_limit():
    base = dict(timestamp=0.0, method="GET", status=200, request_time_ms=1.0, access_key="k")
    assert nginx_log.FrontendRecord(body_bytes_sent=65535, request_length=65535, **base).is_small()
    assert not nginx_log.FrontendRecord(body_bytes_sent=65536, request_length=10, **base).is_small()
    assert not nginx_log.FrontendRecord(body_bytes_sent=10, request_length=65536, **base).is_small()


def test_time_local_offsets():
    a = nginx_log.parse_time_local("22/Nov/2026:03:10:00 +0100")
    b = nginx_log.parse_time_local("22/Nov/2026:02:10:00 +0000")
    assert a == b == dt.datetime(2026, 11, 22, 2, 10, tzinfo=dt.timezone.utc).timestamp()
    with pytest.raises(nginx_log.FrontendParseError, match="month"):
        nginx_log.parse_time_local("22/Foo/2026:03:10:00 +0100")
    with pytest.raises(nginx_log.FrontendParseError, match="31"):
        nginx_log.parse_time_local("31/Feb/2026:03:10:00 +0100")


@FUZZ
@given(st.text(max_size=400))
def test_nginx_parser_never_crashes(text):
    try:
        nginx_log.parse_line(text)
    except nginx_log.FrontendParseError as e:
        assert str(e)


@FUZZ
@given(when=st.datetimes(dt.datetime(2001, 1, 1), dt.datetime(2099, 1, 1), timezones=st.just(dt.timezone.utc)),
       status=st.integers(100, 599), sent=st.integers(0, 10**12), length=st.integers(0, 10**9),
       rt_ms=st.integers(0, 10**7), key=st.one_of(st.just("-"), st.text("ABCDEF0123456789abcdef", min_size=1,
                                                                        max_size=40)),
       agent=st.text(alphabet=st.characters(blacklist_characters='"\n\r'), max_size=40))
def test_nginx_format_roundtrip(when, status, sent, length, rt_ms, key, agent):
    when = when.replace(microsecond=0)
    line = (f'10.0.0.1 - - [{when.strftime("%d/%b/%Y:%H:%M:%S +0000")}] "GET /b/o HTTP/1.1" {status} {sent} '
            f'"-" "{agent}" {rt_ms // 1000}.{rt_ms % 1000:03d} {length} "{key}"')
    rec = nginx_log.parse_line(line)
    assert rec.timestamp == when.timestamp()
    assert (rec.status, rec.body_bytes_sent, rec.request_length) == (status, sent, length)
    assert rec.request_time_ms == pytest.approx(rt_ms)
    assert rec.access_key == (None if key == "-" else key)


# --- uWSGI stats --------------------------------------------------------------------------------
def test_recorded_stats_document():
    stats = uwsgi_stats.parse((TESTDATA / "uwsgi-stats.json").read_bytes())
    assert [w.worker_id for w in stats.workers] == [1, 2]
    raw = json.loads((TESTDATA / "uwsgi-stats.json").read_text())
    assert sum(w.requests for w in stats.workers) == sum(w["requests"] for w in raw["workers"]) > 0
    assert stats.workers[0].avg_rt_ms == raw["workers"][0]["avg_rt"] / 1000  # microseconds in the JSON


@pytest.mark.parametrize("raw, needle", [
    (b"", "not JSON"), (b"[1]", "JSON list"), (b"{}", "no 'workers'"),
    (b'{"workers": [{"id": 1, "requests": "many"}]}', r"workers\[0\].requests"),
    (b'{"workers": [7]}', r"workers\[0\] is not an object"),
])
def test_stats_errors_name_the_field(raw, needle):
    with pytest.raises(uwsgi_stats.StatsError, match=needle) as e:
        uwsgi_stats.parse(raw)
    assert e.value.kind == "parse"


_STATS = (TESTDATA / "uwsgi-stats.json").read_bytes()


@pytest.mark.parametrize("raw, needle", [
    # json.loads reads these as nan / inf; int() of them used to escape as ValueError / OverflowError.
    (_STATS.replace(b'"listen_queue":', b'"listen_queue": NaN, "x":', 1), r"stats.listen_queue is nan, not a finite"),
    (_STATS.replace(b'"avg_rt":', b'"avg_rt": Infinity, "y":', 1), r"workers\[0\].avg_rt is inf, not a finite"),
    (_STATS.replace(b'"requests":', b'"requests": 1e400, "z":', 1), r"workers\[0\].requests is inf, not a finite"),
    (_STATS.replace(b'"requests":', b'"requests": 1%s, "z":' % (b"0" * 30), 1), r"requests .*beyond a 64-bit"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
])
def test_non_finite_or_unreadable_stats_are_a_parse_error(raw, needle):
    with pytest.raises(uwsgi_stats.StatsError, match=needle) as e:
        uwsgi_stats.parse(raw)
    assert e.value.kind == "parse"


@FUZZ
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
                        st.sampled_from(["workers", "id", "requests", "avg_rt", "listen_queue", "status", "x"]),
                        kids, max_size=5), max_leaves=20))
def test_stats_parser_never_crashes(doc):
    try:
        uwsgi_stats.parse(json.dumps(doc).encode())
    except uwsgi_stats.StatsError as e:
        assert e.kind == "parse"


def test_bad_stats_address_is_a_clear_error():
    with pytest.raises(uwsgi_stats.StatsError, match="not HOST:PORT"):
        uwsgi_stats.fetch("localhost", 1)


# --- SigV4 and s3tokens body --------------------------------------------------------------------
def test_sigv4_matches_aws_test_suite_get_vanilla():
    # AWS Signature Version 4 test suite, "get-vanilla"
    canonical = sigv4.canonical_request("GET", "/", "", "example.amazonaws.com", "20150830T123600Z",
                                        hashlib.sha256(b"").hexdigest())
    to_sign = sigv4.string_to_sign(canonical, "20150830T123600Z", "us-east-1", "service")
    assert sigv4.sign("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", to_sign) == \
        "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"


def test_s3tokens_body_carries_base64_string_to_sign():
    import base64
    signed = sigv4.sign_request("AK", "SECRET", "GET", "/b/", "s3.test", now=dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc))
    body = sigv4.s3tokens_body("AK", signed.string_to_sign, signed.signature, signed.x_amz_date)
    creds = body["credentials"]
    assert base64.urlsafe_b64decode(creds["token"]).decode() == signed.string_to_sign
    assert signed.string_to_sign.startswith("AWS4-HMAC-SHA256\n20260102T000000Z\n20260102/us-east-1/s3/aws4_request")
    assert creds["signature"] == signed.signature and "SECRET" not in json.dumps(body)
    assert signed.authorization.startswith("AWS4-HMAC-SHA256 Credential=AK/20260102/us-east-1/s3/aws4_request")


# --- latency summaries ----------------------------------------------------------------------------
@FUZZ
@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=200))
def test_percentiles_are_observed_and_ordered(values):
    s = summarize(values)
    assert s["count"] == len(values)
    assert s["p50_ms"] in values and s["p95_ms"] in values
    assert min(values) <= s["p50_ms"] <= s["p95_ms"] <= s["max_ms"] == max(values)


def test_nearest_rank_percentile_and_errors():
    assert percentile([10, 20, 30, 40, 750], 95) == 750
    assert percentile(list(range(1, 101)), 95) == 95
    assert summarize([]) == {}
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
