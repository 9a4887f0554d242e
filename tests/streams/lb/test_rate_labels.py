"""A tag value of unbounded length never becomes a Prometheus label whole: LbRates (decoded from the wire as
the worker decodes it) shortens host, proxy and sv beyond MAX_LABEL_VALUE characters to a prefix and a hash,
counts it, keeps two values that differ past the cut apart, and removes the shortened series on expiry.
Before: a 1 MB host tag was a 1 MB label value on three gauges, in every scrape."""

from __future__ import annotations

import orjson
from prometheus_client import REGISTRY

from opsloop.streams.lb.rates import LbRates, SERVER_RATE
from opsloop.streams.runtime.gauges import MAX_LABEL_VALUE
from opsloop.wire import parse_record

T0 = 1795310400.0


def _samples(host: str, count: int, ts: float, sv: str = "s1") -> list:
    raw = orjson.dumps({"name": "haproxy", "timestamp": ts,
                        "tags": {"host": host, "proxy": "be", "sv": sv, "type": "server"},
                        "fields": {"hrsp_2xx": count, "weight": 1, "status": "UP"}})
    parsed = parse_record(raw)
    assert not parsed.rejected, parsed.rejected
    return parsed.metrics


def _shortened(tag: str) -> float:
    return REGISTRY.get_sample_value("opsloop_stream_label_values_shortened_total",
                                     {"handler": "lb-rates", "tag": tag}) or 0.0


def _hosts_exported() -> set[str]:
    return {s.labels["lb"] for m in SERVER_RATE.collect() for s in m.samples}


def test_a_megabyte_host_tag_is_a_bounded_label_counted() -> None:
    huge_a, huge_b = "a" * 1_000_000 + "-one", "a" * 1_000_000 + "-two"
    before = _shortened("host")
    lr = LbRates(ttl_s=60)
    for host in (huge_a, huge_b):
        lr.handle(_samples(host, 100, T0), now=0)
    rates = lr.handle(_samples(huge_a, 200, T0 + 10) + _samples(huge_b, 300, T0 + 10), now=1)
    assert sorted(r.rate for r in rates) == [10.0, 20.0]   # nothing lost: both series rated
    exported = {h for h in _hosts_exported() if h.startswith("aaaa")}
    assert len(exported) == 2 and all(len(h) <= MAX_LABEL_VALUE for h in exported), [len(h) for h in exported]
    assert _shortened("host") - before == 4
    for m in REGISTRY.collect():   # no label value anywhere is the tag whole
        assert all(len(v) <= MAX_LABEL_VALUE for s in m.samples for v in s.labels.values()
                   if v.startswith("aaaa")), m.name
    lr.handle([], now=1000)   # silent past ttl_s: the shortened series are removed, not leaked
    assert not {h for h in _hosts_exported() if h.startswith("aaaa")}


def test_a_host_tag_that_fits_is_the_label_unchanged() -> None:
    host = "h" * MAX_LABEL_VALUE
    before = _shortened("host")
    lr = LbRates()
    lr.handle(_samples(host, 100, T0), now=0)
    (r,) = lr.handle(_samples(host, 150, T0 + 10), now=1)
    assert r.lb == host and host in _hosts_exported()
    assert _shortened("host") == before
