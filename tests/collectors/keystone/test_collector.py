"""The collector's round on recorded and generated logs, and its errors when Keystone is not there."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import textwrap
import threading

import pytest
import yaml

from opsloop.collectors.keystone import Config, build
from opsloop.lab.keystone_server import free_port
from opsloop.collect.types import CollectorUnavailable
from tests.helpers import REPO

TESTDATA = REPO / "collectors" / "keystone" / "testdata"


def nginx_line(key: str | None, ms: int, sent: int = 512, length: int = 400, status: int = 200) -> str:
    return (f'10.1.2.3 - - [22/Nov/2026:03:15:00 +0000] "GET /bucket/obj HTTP/1.1" {status} {sent} "-" '
            f'"aws-cli/2" {ms // 1000}.{ms % 1000:03d} {length} "{key or "-"}"\n')


def by_name(metrics, name):
    return [m for m in metrics if m.name == name]


def frontend_collector(tmp_path, **frontend):
    log = tmp_path / "s3-access.log"
    log.write_text("")
    cfg = Config(host="edge-1", probes={"enabled": False}, frontend={"access_logs": [str(log)], **frontend})
    return build(cfg), log


def test_small_request_p95_before_and_after_credential_caching(tmp_path):
    """p95 of small requests ~750 ms with Keystone validation, ~100 ms with cached credentials ("RadosGW/
    Keystone Integration Performance Issues—Finally Solved?"); large transfers do not count as small, whatever their latency."""
    collector, log = frontend_collector(tmp_path)
    before = [nginx_line("AKSLOW", 40)] * 90 + [nginx_line("AKSLOW", 750)] * 10 + \
             [nginx_line("AKBIG", 9000, sent=10_000_000)] * 20 + [nginx_line("AKUP", 9000, length=70000)] * 5
    log.write_text("".join(before))
    r1 = collector.collect()
    after = [nginx_line("AKSLOW", 8)] * 94 + [nginx_line("AKSLOW", 100)] * 6 + \
            [nginx_line("AKBIG", 9000, sent=10_000_000)] * 20
    with open(log, "a") as f:
        f.write("".join(after))
    r2 = collector.collect()
    t1, t2 = by_name(r1.metrics, "s3_frontend_requests")[0], by_name(r2.metrics, "s3_frontend_requests")[0]
    assert (t1.fields["small_requests"], t1.fields["small_p95_ms"]) == (100, 750)
    assert (t2.fields["small_requests"], t2.fields["small_p95_ms"]) == (100, 100)
    assert t1.fields["requests"] == 125 and t2.fields["requests"] == 120
    assert not r1.errors and not r2.errors


def test_per_credential_counts_heaviest_first_with_other_bucket_and_local_keys(tmp_path):
    collector, log = frontend_collector(tmp_path, top_credentials=3, local_access_keys=["AKLOCAL"])
    counts = {"AKA": 7, "AKB": 30, "AKC": 2, "AKD": 11, "AKLOCAL": 5, "AKE": 1}
    lines = [nginx_line(k, 50) for k, n in counts.items() for _ in range(n)] + [nginx_line(None, 3)] * 4
    log.write_text("".join(lines))
    r = collector.collect()
    creds = by_name(r.metrics, "s3_frontend_credential")
    assert [(m.tags["access_key"], m.fields["requests"], m.fields["rank"]) for m in creds] == [
        ("AKB", 30, 1), ("AKD", 11, 2), ("AKA", 7, 3), ("_other", 2 + 5 + 1, 0)]
    other = creds[-1]
    assert other.fields["keystone_validations"] == 3  # AKLOCAL's 5 requests never reached Keystone
    total = by_name(r.metrics, "s3_frontend_requests")[0]
    assert (total.fields["signed"], total.fields["anonymous"], total.fields["keystone_validations"]) == (56, 4, 51)
    assert total.fields["credentials"] == 6
    assert all(list(m.tags)[0] == "host" for m in r.metrics)


def test_unparsable_lines_are_counted_sampled_redacted_and_not_fatal(tmp_path):
    collector, log = frontend_collector(tmp_path)
    bad = ['garbage line one\n', '10.0.0.1 - - [x] "GET /o?X-Amz-Signature=deadbeef HTTP/1.1" 200\n',
           'third bad\n', 'fourth bad\n']
    log.write_text(nginx_line("AK1", 10) + "".join(bad) + nginx_line("AK1", 20))
    r = collector.collect()
    assert by_name(r.metrics, "s3_frontend_requests")[0].fields["requests"] == 2
    stats = by_name(r.metrics, "s3_frontend_logfile")[0]
    assert (stats.fields["lines"], stats.fields["unparsed"]) == (6, 4)
    [err] = r.errors
    assert err.kind == "parse" and err.target == str(log)
    assert err.message.startswith("4 of 6 lines unparsable")
    assert "garbage line one" in err.message and "fourth bad" not in err.message  # 3 samples by default
    assert "deadbeef" not in err.message and "?<redacted>" in err.message


def test_uwsgi_log_per_endpoint_rate_and_latency_from_recorded_log(tmp_path):
    log = tmp_path / "access.log"
    shutil.copy(TESTDATA / "uwsgi-access.log", log)
    cfg = Config(host="ks-1", probes={"enabled": False}, uwsgi_access_log=str(log), start_at="start")
    r = build(cfg).collect()
    recorded = [line for line in log.read_text().splitlines()]
    per_endpoint = {(m.tags["method"], m.tags["endpoint"]): m.fields for m in by_name(r.metrics, "keystone_requests")}
    s3 = per_endpoint[("POST", "/v3/s3tokens")]
    assert s3["count"] == sum(1 for line in recorded if "method=POST uri=/v3/s3tokens " in line)
    assert s3["p50_ms"] <= s3["p95_ms"] <= s3["max_ms"] and s3["rate_per_s"] > 0
    assert per_endpoint[("GET", "/v3/users/{id}")]["status_4xx"] == 1
    assert sum(f["count"] for f in per_endpoint.values()) == len(recorded)
    assert not r.errors


def test_max_endpoints_folds_the_tail_into_other(tmp_path):
    log = tmp_path / "access.log"
    lines = [f"uwsgi_req ts_ms=1795315485635 method=GET uri=/v3/path{i % 7} status=200 msecs={i} rsize=1 pid=1"
             for i in range(70)]
    log.write_text("\n".join(lines) + "\n")
    cfg = Config(probes={"enabled": False}, uwsgi_access_log=str(log), start_at="start", max_endpoints=3)
    series = by_name(build(cfg).collect().metrics, "keystone_requests")
    assert len(series) == 3 and series[-1].tags["endpoint"] == "_other" and series[-1].fields["count"] == 50


def test_bad_stats_document_is_an_error_and_the_access_log_is_still_read(tmp_path):
    # A stats server answering NaN: the round reports it and still emits the access log's samples.
    bad = (TESTDATA / "uwsgi-stats.json").read_bytes().replace(b'"listen_queue":', b'"listen_queue": NaN, "x":', 1)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(30)  # the round fetches once; a test that never connects must not hang the thread

    def serve():
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.sendall(bad)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    log = tmp_path / "access.log"
    shutil.copy(TESTDATA / "uwsgi-access.log", log)
    try:
        cfg = Config(host="ks-1", probes={"enabled": False}, uwsgi_access_log=str(log), start_at="start",
                     uwsgi_stats=f"127.0.0.1:{server.getsockname()[1]}")
        r = build(cfg).collect()
    finally:
        thread.join(30)
        server.close()
    [err] = r.errors
    assert err.kind == "parse" and "listen_queue is nan" in err.message
    assert not by_name(r.metrics, "uwsgi_server")
    requests = by_name(r.metrics, "keystone_requests")
    assert sum(m.fields["count"] for m in requests) == len(log.read_text().splitlines()) > 0


def test_keystone_down_is_an_unreachable_error_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSLOOP_KEYSTONE_USERNAME", "probe")
    monkeypatch.setenv("OPSLOOP_KEYSTONE_PASSWORD", "pw-never-shown")
    monkeypatch.setenv("OPSLOOP_KEYSTONE_PROJECT", "service")
    port = free_port()  # nothing listens there
    cfg = Config(url=f"http://127.0.0.1:{port}", probes={"timeout_s": 2}, uwsgi_stats=f"127.0.0.1:{free_port()}")
    r = build(cfg).collect()
    kinds = {(e.kind, e.target.split("/v3")[0]) for e in r.errors}
    assert ("unreachable", f"http://127.0.0.1:{port}") in kinds
    assert any(e.kind == "unreachable" and "uWSGI stats" in e.message for e in r.errors)
    assert all("pw-never-shown" not in e.message for e in r.errors)
    [probe] = by_name(r.metrics, "keystone_probe")
    assert probe.fields["count"] == 0 and probe.fields["errors"] == 1
    assert by_name(r.metrics, "keystone_probe_errors")[0].tags["status"] == "unreachable"


def test_probes_without_credentials_and_nothing_else_is_unavailable(monkeypatch):
    for var in ("USERNAME", "PASSWORD", "PROJECT"):
        monkeypatch.delenv(f"OPSLOOP_KEYSTONE_{var}", raising=False)
    with pytest.raises(CollectorUnavailable, match="OPSLOOP_KEYSTONE_"):
        build(Config()).collect()


def test_missing_credentials_with_other_sources_is_a_round_error(tmp_path, monkeypatch):
    monkeypatch.delenv("OPSLOOP_KEYSTONE_USERNAME", raising=False)
    creds = tmp_path / "c.yaml"
    creds.write_text(yaml.safe_dump({"username": "u"}))
    collector, log = frontend_collector(tmp_path)
    cfg = collector.config.model_copy(update={"probes": collector.config.probes.model_copy(
        update={"enabled": True, "credentials_file": creds})})
    r = build(cfg).collect()
    assert any(e.kind == "auth" and e.target == "probe-credentials" and "password" in e.message for e in r.errors)
    assert by_name(r.metrics, "s3_frontend_requests")


UNREADABLE_LOG_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from opsloop.collectors.keystone import Config, build
    d = Path(sys.argv[1])
    uw, fe, line = d / "uwsgi-access.log", d / "s3-access.log", sys.argv[2]
    nginx = sys.argv[3]

    def summary(r):
        return {"errors": [[e.target, e.kind, e.message] for e in r.errors],
                "uwsgi_parsed": [m.fields["parsed"] for m in r.metrics if m.name == "keystone_logfile"],
                "frontend_requests": [m.fields["requests"] for m in r.metrics if m.name == "s3_frontend_requests"]}

    def add(path, text):
        with open(path, "a") as f:
            f.write(text)

    cfg = Config(host="ks-1", probes={"enabled": False}, uwsgi_access_log=str(uw),
                 frontend={"access_logs": [str(fe)]})
    c = build(cfg)
    add(uw, line)
    add(fe, nginx)
    out = {"readable": summary(c.collect())}
    # logrotate "create 0640 root adm": the new file is not readable by the collector's user
    add(uw, line)
    os.rename(uw, d / "uwsgi-access.log.1")
    uw.write_text(line * 2)
    uw.chmod(0)
    add(fe, nginx * 3)
    out["rotated_unreadable"] = summary(c.collect())
    uw.chmod(0o600)
    out["readable_again"] = summary(c.collect())
    # the collector starting while the log is unreadable
    uw.chmod(0)
    try:
        out["start_unreadable"] = summary(build(cfg).collect())
    except Exception as e:
        out["start_unreadable"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
""")


def test_unreadable_access_log_costs_its_own_lines_only(tmp_path):
    """A log the collector may not read (the file logrotate created 0640 root:adm) is a `permission` error for
    that log; the round's other sources still report, the rotated file is drained, and the log is read once
    readable. It used to fail the whole round every interval (and the start with a traceback)."""
    uwsgi = (TESTDATA / "uwsgi-access.log").read_text().splitlines()[0] + "\n"
    # without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH, root is refused a mode-0 file like any user
    res = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "-c",
                          UNREADABLE_LOG_SCRIPT, str(tmp_path), uwsgi, nginx_line("AKA", 40)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["readable"] == {"errors": [], "uwsgi_parsed": [1], "frontend_requests": [1]}
    rotated = out["rotated_unreadable"]
    assert rotated["frontend_requests"] == [3] and rotated["uwsgi_parsed"] == [1]   # the old file drained
    [(target, kind, message)] = rotated["errors"]
    assert (target, kind) == (str(tmp_path / "uwsgi-access.log"), "permission") and "Permission denied" in message
    assert out["readable_again"] == {"errors": [], "uwsgi_parsed": [2], "frontend_requests": [0]}
    start = out["start_unreadable"]
    assert isinstance(start, dict), start
    assert [e[1] for e in start["errors"]] == ["permission"] and start["frontend_requests"] == [0]
