"""The edge API's token file is re-read when it changes; one with no usable token refuses the API, not the loop.

Before (old code): the token was read once at start. Rotating it needed a restart (the new token got 401 until
then, the old one kept working), and a restart while the file was empty (a rewrite in progress, a secret not
yet mounted) exited 78: systemd does not restart that, and the control loop stayed down with the API.
Now: the file is looked at (stat) at most once a second and re-read when it changed: the new token is taken,
the old refused. While it gives no usable token (missing, empty, short, unreadable, open to others) every
``/v1`` request gets 503 with a JSON error, ``api_token_unusable`` is logged once per change and
``opsloop_edge_api_token_usable`` is 0; the loop runs on. A file open to others or not UTF-8 at start still
exits 78 (tests/controllers/edge/service/test_api_port_taken.py): that is a misconfiguration, not a rewrite.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
import requests
from prometheus_client import REGISTRY

from opsloop.controllers.edge.service.api_token import TokenFile, TokenFileError
from tests.helpers import (captured_logs, free_port, opsloop_process, scrape_metric, unique, wait_until,
                           write_config)

TOPOLOGY = {"listeners": [{"name": "web", "edges": [{"name": "e1"}],
                           "origins": [{"name": "near", "capacity_rps": 40}, {"name": "far", "capacity_rps": 40}],
                           "latency_ms": {"e1": {"near": 2, "far": 30}}}]}


def write_private(path: Path, text: str) -> None:
    """Rewrite ``path`` in place (truncate, write), as an editor or `echo > file` does; mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def replace_private(path: Path, text: str) -> None:
    """Rotate ``path`` atomically: a new file renamed over it (a new inode), as secret managers do."""
    tmp = path.with_name(path.name + ".new")
    write_private(tmp, text)
    os.replace(tmp, path)


def status(port: int, token: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return requests.get(f"http://127.0.0.1:{port}/v1/status", headers=headers, timeout=10)


@pytest.mark.integration
def test_an_empty_token_file_at_start_refuses_the_api_not_the_loop_and_a_rotation_needs_no_restart(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    token_file = tmp_path / "edge.token"
    write_private(token_file, "\n")   # empty: a secret not yet written
    metrics_port, api_port = free_port(), free_port()
    config = write_config(tmp_path / "opsloop.yaml", {
        "kafka": {"bootstrap_servers": kafka_bootstrap, "topic_prefix": unique("tokrot") + "."},
        "controllers": {"edge": {"interval_s": 1, "topology": TOPOLOGY, "overrides_file": None,
                                 "metrics_port": metrics_port,
                                 "api": {"port": api_port, "token_file": str(token_file)}}}})
    svc = opsloop_process("edge-token", ["edge", "run", "--config", str(config)], tmp_path / "svc",
                          ready=lambda: requests.get(f"http://127.0.0.1:{api_port}/openapi.json", timeout=1).ok)
    svc.start()   # old code: exited 78 here
    try:
        r = status(api_port, "x" * 32)
        assert r.status_code == 503 and "no usable bearer token" in r.json()["error"], r.text
        assert status(api_port, None).status_code == 503
        assert scrape_metric(metrics_port, "opsloop_edge_api_token_usable") == 0
        first = wait_until(lambda: scrape_metric(metrics_port, "opsloop_edge_last_tick_timestamp_seconds"),
                           timeout=60, what="the control loop ticking")
        wait_until(lambda: scrape_metric(metrics_port, "opsloop_edge_last_tick_timestamp_seconds") > first,
                   timeout=60, what="the control loop ticking on")

        old, new = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        write_private(token_file, old + "\n")   # the operator writes the token: no restart
        wait_until(lambda: status(api_port, old).status_code == 200, timeout=30, what="the token taken")
        assert status(api_port, "x" * 32).status_code == 401
        assert scrape_metric(metrics_port, "opsloop_edge_api_token_usable") == 1

        replace_private(token_file, new + "\n")   # rotation
        wait_until(lambda: status(api_port, new).status_code == 200, timeout=30, what="the rotated token taken")
        assert status(api_port, old).status_code == 401

        write_private(token_file, "")   # emptied while running: refused again, said once
        wait_until(lambda: status(api_port, new).status_code == 503, timeout=30, what="an empty file refused")
        assert scrape_metric(metrics_port, "opsloop_edge_api_token_usable") == 0
        wait_until(lambda: scrape_metric(metrics_port, "opsloop_edge_last_tick_timestamp_seconds") > first + 2,
                   timeout=60, what="the loop still ticking")
        log = svc.logfile.read_text()
        assert log.count('"api_token_unusable"') == 2, svc.tail(40)   # at start, at the emptying: once per change
        assert log.count('"api_token_rotated"') == 1 and old not in log and new not in log
    finally:
        svc.stop()


def test_a_token_file_opened_to_others_while_running_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "edge.token"
    token = secrets.token_urlsafe(24)
    write_private(path, token)
    clock = [0.0]
    tf = TokenFile(path, clock=lambda: clock[0])
    assert tf.matches(token) is True and tf.matches(token + "x") is False
    with captured_logs() as logs:
        path.chmod(0o644)   # a chmod changes neither size nor mtime: only ctime says so
        assert tf.matches(token) is True   # within check_every_s: not looked at yet
        clock[0] += 1.0
        assert tf.matches(token) is None and "chmod 600" in tf.problem
        clock[0] += 1.0
        tf.matches(token)
    assert [line.split(" ", 1)[0] for line in logs.lines] == ["api_token_unusable"]
    assert token not in " ".join(logs.lines)
    assert REGISTRY.get_sample_value("opsloop_edge_api_token_usable") == 0
    path.chmod(0o600)
    clock[0] += 1.0
    assert tf.matches(token) is True and REGISTRY.get_sample_value("opsloop_edge_api_token_usable") == 1


@pytest.mark.parametrize("content, mode, lasting", [
    (None, 0o600, False), (b"\n", 0o600, False), (b"short\n", 0o600, False),
    (b"a-token-of-enough-characters", 0o640, True), (b"\xff" * 20, 0o600, True)],
    ids=["missing", "empty", "short", "open to group", "not UTF-8"])
def test_at_start_only_a_misconfigured_file_stops_the_service(tmp_path: Path, content: bytes | None, mode: int,
                                                              lasting: bool) -> None:
    path = tmp_path / "edge.token"
    if content is not None:
        path.write_bytes(content)
        path.chmod(mode)
    tf = TokenFile(path)
    assert tf.matches("a-token-of-enough-characters") is None
    if lasting:
        with pytest.raises(TokenFileError, match=str(path)):
            tf.raise_if_lasting()
    else:
        tf.raise_if_lasting()
