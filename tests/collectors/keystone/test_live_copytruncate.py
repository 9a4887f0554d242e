"""copytruncate of the real uWSGI request log: the requests logged between our last read and the copy are
counted (read from ``access.log.1``), not lost at every rotation as before.

The log is shared by the whole session's tests: each wait counts our requests in the bytes written since
they were sent, never in the whole file (a ``/v3`` line of an earlier test satisfied a whole-file count
before ours was written; ours then landed after the first read and was counted in the second round)."""

from __future__ import annotations

import pytest
import requests

from opsloop.collectors.keystone import Config, build
from tests.collectors.keystone.lab import keystone_lab  # noqa: F401  (session fixture)
from tests.collectors.keystone.test_live import wait_for_log_to_settle
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def test_requests_logged_before_the_copy_are_counted_from_the_copy(keystone_lab):
    ks = keystone_lab.keystone
    wait_for_log_to_settle(ks.access_log)
    collector = build(Config(host="keystone-test", url=ks.url, probes={"enabled": False},
                             uwsgi_access_log=str(ks.access_log)))
    session = requests.Session()

    def logged(uri: str, n: int, since: int) -> None:
        def ours() -> str:
            return ks.access_log.read_bytes()[since:].decode()
        wait_until(lambda: ours().count(f"uri={uri} ") >= n and ours().endswith("\n"), timeout=30,
                   what=f"uWSGI to log {n} x {uri}")

    start = ks.access_log.stat().st_size
    assert session.get(f"{ks.url}/v3", timeout=30).status_code == 200
    logged("/v3", 1, since=start)
    collector.collect()
    start = ks.access_log.stat().st_size
    for _ in range(3):   # after our read, before the rotation: in access.log.1 only
        assert session.get(f"{ks.url}/v3/auth/tokens", timeout=30).status_code == 401
    logged("/v3/auth/tokens", 3, since=start)
    ks.copytruncate_access_log()
    for _ in range(2):
        assert session.get(f"{ks.url}/v3/users", timeout=30).status_code == 401
    logged("/v3/users", 2, since=0)  # the log was truncated: all of it is ours
    r = collector.collect()
    counts = {m.tags["endpoint"]: m.fields["count"] for m in r.metrics if m.name == "keystone_requests"}
    assert counts == {"/v3/auth/tokens": 3, "/v3/users": 2}, "before: the three before the copy were lost"
    [f] = [m.fields for m in r.metrics if m.name == "keystone_logfile"]
    assert (f["truncations"], f["truncations_unrecovered"], f["unparsed"]) == (1, 0, 0)
    collector.close()
