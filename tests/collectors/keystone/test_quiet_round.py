"""A round without requests says so: counts of 0 and no latency field (never 0 ms, never NaN)."""

from __future__ import annotations

import math
from pathlib import Path

from opsloop.collectors.keystone import Config, build

NGINX = ('10.0.0.1 - - [22/Nov/2026:02:35:17 +0000] "GET /b/k HTTP/1.1" 200 10 "-" "aws-cli" 0.750 300 '
         '"AKIAEXAMPLE"\n')


def test_a_quiet_round_has_counts_and_no_latency(tmp_path: Path) -> None:
    uwsgi, nginx = tmp_path / "uwsgi.log", tmp_path / "s3.log"
    uwsgi.write_text("")
    nginx.write_text("")
    collector = build(Config(probes={"enabled": False}, uwsgi_access_log=str(uwsgi),
                             frontend={"access_logs": [str(nginx)]}))
    with open(nginx, "a") as f:
        f.write(NGINX)
    busy = collector.collect()
    [fe] = [m.fields for m in busy.metrics if m.name == "s3_frontend_requests"]
    assert fe["small_requests"] == 1 and fe["small_p95_ms"] == 750.0
    quiet = collector.collect()
    assert not quiet.errors
    [fe] = [m.fields for m in quiet.metrics if m.name == "s3_frontend_requests"]
    assert fe["requests"] == fe["small_requests"] == 0
    assert not {k for k in fe if k.endswith("_ms")}, fe
    assert not [m for m in quiet.metrics if m.name in ("keystone_requests", "s3_frontend_credential")]
    assert all(not (isinstance(v, float) and math.isnan(v)) for m in quiet.metrics for v in m.fields.values())
