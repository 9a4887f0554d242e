"""Runs that did not measure every stream for its whole run_s, with the real netperf against real netservers on
loopback: a failed stream makes its run partial (its sum kept apart from mean_gbps), a stream that ended early
(netperf given a shorter -l, or interrupted: it still exits 0 with a result) is flagged and counted as failed."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from pydantic import ValidationError

from opsloop.collect.types import Round
from opsloop.collectors.netperf import Config, build
from opsloop.collectors.netperf.collector import SET_METRIC, TARGET_METRIC
from opsloop.collectors.netperf.config import TargetSet, parse_target
from opsloop.collectors.netperf.drivers import NetperfDriver
from opsloop.collectors.netperf.runner import Completed
from opsloop.records import Metric
from opsloop.stack import free_port
from tests.collectors.netperf.lab import Server, netserver

pytestmark = pytest.mark.integration


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    try:
        for _ in range(2):
            started.append(netserver(free_port()))
        yield started
    finally:
        for s in started:
            s.stop()


def wrapper(tmp_path: Path, body: str) -> str:
    """A netperf_path that runs the real netperf, changing its argv as ``body`` says (a shell case on "$*")."""
    tool = tmp_path / "netperf-wrapper"
    tool.write_text(f'#!/bin/sh\n{body}\nexec netperf "$@"\n')
    tool.chmod(0o755)
    return str(tool)


def set_sample(rnd: Round) -> Metric:
    [s] = [m for m in rnd.metrics if m.name == SET_METRIC]
    return s


def test_one_failed_stream_of_a_target_leaves_no_complete_sum(servers: list[Server], tmp_path: Path) -> None:
    base, dead = free_port(), free_port()
    # Stream 1 (remote data port base+1) of every run goes to a port where no netserver listens: refused.
    tool = wrapper(tmp_path, f'case "$*" in *",{base + 1}"*) exec netperf -H 127.0.0.1 -p {dead} -l 1;; esac')
    target = f"127.0.0.1:{servers[0].port}"
    c = build(Config(host="h", netperf_path=tool, target_sets=[{
        "name": "lo", "targets": [target], "streams_per_target": 2, "data_port": base, "run_s": 1,
        "repetitions": 2, "timeout_margin_s": 10}]))
    rnd = c.collect()
    [err] = rnd.errors
    assert err.target == f"lo/{target}" and err.kind == "unreachable"
    f = set_sample(rnd).fields
    assert (f["runs"], f["complete_runs"], f["failed_targets"]) == (2, 0, 1)
    assert (f["streams"], f["streams_ok"], f["streams_attempted"]) == (2, 2, 4)
    # One stream of two is not the link's throughput: no mean_gbps, the sum is marked partial.
    assert "mean_gbps" not in f and "min_gbps" not in f and f["partial_mean_gbps"] > 0
    [per] = [m for m in rnd.metrics if m.name == TARGET_METRIC]
    assert per.fields["runs_ok"] == 0 and per.fields["streams_ok"] == 2 and "mean_gbps" not in per.fields


def test_a_partial_run_is_not_averaged_with_the_complete_ones(servers: list[Server], tmp_path: Path) -> None:
    base, dead = free_port(), free_port()
    marker = tmp_path / "failed-once"
    # Only the first run's stream 1 fails (one process per run carries ",base+1", so no race on the marker).
    tool = wrapper(tmp_path, f'case "$*" in *",{base + 1}"*) if [ ! -e {marker} ]; then : > {marker}; '
                             f'exec netperf -H 127.0.0.1 -p {dead} -l 1; fi;; esac')
    c = build(Config(host="h", netperf_path=tool, target_sets=[{
        "name": "lo", "targets": [f"127.0.0.1:{servers[0].port}"], "streams_per_target": 2, "data_port": base,
        "run_s": 1, "repetitions": 2, "timeout_margin_s": 10}]))
    f = set_sample(c.collect()).fields
    assert (f["runs"], f["complete_runs"], f["streams_ok"], f["streams_attempted"]) == (2, 1, 3, 4)
    # mean/min/max are the complete run alone; the partial run's sum is reported apart.
    assert f["mean_gbps"] == f["min_gbps"] == f["max_gbps"] and f["stddev_gbps"] == 0
    assert f["partial_mean_gbps"] > 0


def test_a_stream_that_ended_early_is_flagged_and_left_out(servers: list[Server], tmp_path: Path) -> None:
    cut = servers[1].port
    # The stream to the second netserver is given -l 1 instead of -l 3: netperf exits 0 with ELAPSED_TIME~1.
    tool = wrapper(tmp_path, f'case "$*" in *"-p {cut} "*) set -- $(echo "$@" | sed "s/-l 3/-l 1/");; esac')
    good, short = f"127.0.0.1:{servers[0].port}", f"127.0.0.1:{cut}"
    c = build(Config(host="h", netperf_path=tool, target_sets=[{
        "name": "lo", "targets": [good, short], "run_s": 3, "repetitions": 1, "timeout_margin_s": 10}]))
    rnd = c.collect()
    [err] = rnd.errors
    assert err.target == f"lo/{short}" and err.kind == "tool"
    assert "of run_s=3" in err.message and "ended early" in err.message and "min_elapsed_ratio=0.9" in err.message
    f = set_sample(rnd).fields
    assert (f["short_streams"], f["complete_runs"], f["failed"], f["streams_ok"]) == (1, 0, short, 1)
    assert "mean_gbps" not in f and f["partial_mean_gbps"] > 0
    per = {m.tags["target"]: m.fields for m in rnd.metrics if m.name == TARGET_METRIC}
    assert per[good]["runs_ok"] == 1 and per[short]["runs_failed"] == 1 and "mean_gbps" not in per[short]


def test_min_elapsed_ratio_is_validated() -> None:
    assert TargetSet(name="x", targets=["127.0.0.1"]).min_elapsed_ratio == 0.9
    with pytest.raises(ValidationError, match="min_elapsed_ratio"):
        TargetSet(name="x", targets=["127.0.0.1"], min_elapsed_ratio=1.5)


def test_netperf_output_without_elapsed_time_is_torn() -> None:
    # We ask for ELAPSED_TIME; output that stops before it cannot be checked against run_s.
    tset = TargetSet(name="x", targets=["127.0.0.1"], run_s=1)
    done = Completed(argv=("netperf",), returncode=0, stdout="THROUGHPUT=5932.08\nTHROUGHPUT_UNITS=10^6bits/s\n",
                     stderr="", timed_out=False, duration_s=1.0)
    out = NetperfDriver().interpret(done, tset, parse_target("127.0.0.1", 12865), 11.0)
    assert out.kind == "parse" and "lacks ELAPSED_TIME" in (out.message or "")
