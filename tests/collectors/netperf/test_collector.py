"""The throughput collector against real netserver/netperf and iperf3 on free loopback ports."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from opsloop.collect.types import CollectorUnavailable, Round
from opsloop.topics import Topic

from opsloop.collectors.netperf import Config, build
from opsloop.collectors.netperf.cli import main
from opsloop.collectors.netperf.collector import SET_METRIC, TARGET_METRIC
from opsloop.collectors.netperf.config import TargetSet
from opsloop.records import Metric
from opsloop.stack import free_port
from opsloop.validation import WireError
from tests.helpers import REPO
from tests.collectors.netperf.lab import Server, iperf3_server, netserver, processes_with, wait_for

pytestmark = pytest.mark.integration

TESTDATA = REPO / "collectors" / "netperf" / "testdata"


@pytest.fixture
def netservers() -> Iterator[list[Server]]:
    """Two netservers on loopback: two "VMs" of a target set."""
    servers: list[Server] = []
    try:
        for _ in range(2):
            servers.append(netserver(free_port()))
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def iperf3_servers() -> Iterator[list[Server]]:
    servers: list[Server] = []
    try:
        for _ in range(2):
            servers.append(iperf3_server(free_port()))
        yield servers
    finally:
        for s in servers:
            s.stop()


def targets(servers: list[Server]) -> list[str]:
    return [f"127.0.0.1:{s.port}" for s in servers]


def only(rnd: Round, name: str, **tags: str) -> list:
    return [m for m in rnd.metrics if m.name == name and all(m.tags.get(k) == v for k, v in tags.items())]


def collector(**set_kw: object):  # type: ignore[no-untyped-def]
    base = {"name": "lo", "run_s": 1, "repetitions": 2, "timeout_margin_s": 10}
    return build(Config(host="bench-01", target_sets=[{**base, **set_kw}]))


def test_parallel_streams_summed_and_repeated(netservers: list[Server]) -> None:
    c = collector(targets=targets(netservers), repetitions=3, labels={"queues": 8, "kernel": "6.1"})
    rnd = c.collect()
    assert rnd.errors == []
    [s] = only(rnd, SET_METRIC)
    assert list(s.tags)[0] == "host" and s.key == "lo" and s.topic == Topic.NETPERF   # keyed by its set (opsloop.topics.KEY_TAGS)
    assert s.tags == {"host": "bench-01", "target_set": "lo", "driver": "netperf", "test": "TCP_STREAM",
                      "queues": "8", "kernel": "6.1"}
    f = s.fields
    assert (f["runs"], f["runs_planned"], f["complete_runs"], f["targets"], f["failed_targets"]) == (3, 3, 3, 2, 0)
    assert f["failed"] == "" and f["streams"] == 2
    assert 0 < f["min_gbps"] <= f["mean_gbps"] <= f["max_gbps"]
    assert f["stddev_gbps"] >= 0
    per = only(rnd, TARGET_METRIC)
    assert sorted(m.tags["target"] for m in per) == sorted(targets(netservers))
    # Every run was complete, so the mean of the per-run sums is the sum of the per-target means.
    assert sum(m.fields["mean_gbps"] for m in per) == pytest.approx(f["mean_gbps"], rel=1e-4)
    assert all(m.fields["runs_ok"] == 3 and m.fields["runs_failed"] == 0 for m in per)
    assert c.runner.peak <= c.config.max_processes and c.runner.alive == 0


def test_csv_output_and_pinned_data_ports_with_several_streams(netservers: list[Server]) -> None:
    base = free_port()  # the streams pin base, base+1, base+2
    c = collector(targets=targets(netservers[:1]), streams_per_target=3, omni_output="csv", data_port=base,
                  repetitions=1)
    rnd = c.collect()
    # Three streams to one netserver at once: each needs its own pinned port, or they would collide.
    assert rnd.errors == []
    [s] = only(rnd, SET_METRIC)
    assert s.fields["streams"] == 3 and s.fields["complete_runs"] == 1 and s.fields["mean_gbps"] > 0


def test_a_down_target_is_reported_and_the_others_still_measured(netservers: list[Server]) -> None:
    dead = f"127.0.0.1:{free_port()}"
    c = collector(targets=[*targets(netservers[:1]), dead])
    rnd = c.collect()
    [err] = rnd.errors
    assert err.target == f"lo/{dead}" and err.kind == "unreachable"
    assert "no netserver answering" in err.message and "2 of 2 runs" in err.message
    assert "left out of the set's throughput" in err.message
    [s] = only(rnd, SET_METRIC)
    # Dead in every run: left out of the set, named apart; the runs of the target that answered are complete
    # (tests/collectors/netperf/test_dead_target.py).
    assert (s.fields["runs"], s.fields["complete_runs"], s.fields["failed_targets"]) == (2, 2, 1)
    assert (s.fields["dead_targets"], s.fields["dead"], s.fields["failed"]) == (1, dead, dead)
    assert (s.fields["streams_ok"], s.fields["streams_attempted"]) == (2, 4)
    assert s.fields["mean_gbps"] > 0 and "partial_mean_gbps" not in s.fields
    [down] = only(rnd, TARGET_METRIC, target=dead)
    assert down.fields["runs_failed"] == 2 and down.fields["streams_ok"] == 0 and "mean_gbps" not in down.fields
    [up] = only(rnd, TARGET_METRIC, target=targets(netservers[:1])[0])
    assert up.fields["mean_gbps"] == pytest.approx(s.fields["mean_gbps"])


def test_all_targets_down_reports_failures_without_throughput() -> None:
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    rnd = collector(targets=dead).collect()
    assert sorted(e.target for e in rnd.errors) == sorted(f"lo/{d}" for d in dead)
    assert {e.kind for e in rnd.errors} == {"unreachable"}
    [s] = only(rnd, SET_METRIC)
    assert s.fields["runs"] == 0 and s.fields["failed_targets"] == 2 and "mean_gbps" not in s.fields


def test_garbage_output_is_a_parse_error_with_its_first_bytes(netservers: list[Server]) -> None:
    # /bin/echo stands in for a netperf that prints something unexpected (exit 0, garbage on stdout).
    c = build(Config(host="h", netperf_path="/bin/echo",
                     target_sets=[{"name": "g", "targets": targets(netservers[:1]), "run_s": 1, "repetitions": 1}]))
    rnd = c.collect()
    [err] = rnd.errors
    assert err.kind == "parse" and "-H 127.0.0.1" in err.message
    assert only(rnd, SET_METRIC)[0].fields["runs"] == 0


def test_a_hung_netserver_costs_one_timeout_and_leaves_no_process(netservers: list[Server]) -> None:
    hung = netservers[0]
    hung.pause()  # accepts the control connection in the kernel but never answers: netperf waits forever
    c = collector(targets=targets(netservers), repetitions=1, timeout_margin_s=2.5)
    rnd = c.collect()
    [err] = rnd.errors
    assert err.kind == "timeout" and f"127.0.0.1:{hung.port}" in err.target and "killed" in err.message
    [s] = only(rnd, SET_METRIC)
    assert s.fields["runs"] == 1 and s.fields["failed_targets"] == 1  # the healthy one was measured
    assert processes_with("netperf", "-p", str(hung.port)) == []


def test_missing_netperf_is_one_clear_error() -> None:
    c = build(Config(netperf_path="/nonexistent/netperf", target_sets=[{"name": "x", "targets": ["127.0.0.1"]}]))
    with pytest.raises(CollectorUnavailable) as e:
        c.collect()
    assert "netperf not found" in str(e.value) and "apt-get install netperf" in str(e.value)


def test_missing_iperf3_is_one_clear_error() -> None:
    c = build(Config(iperf3_path="/nonexistent/iperf3",
                     target_sets=[{"name": "x", "targets": ["127.0.0.1"], "driver": "iperf3"}]))
    with pytest.raises(CollectorUnavailable, match="iperf3 not found"):
        c.collect()


def test_missing_namespace_is_a_set_error() -> None:
    rnd = collector(targets=["127.0.0.1"], netns="opsloop-no-such-ns").collect()
    [err] = rnd.errors
    assert err.kind == "tool" and "opsloop-no-such-ns" in err.message and rnd.metrics == []


def _stand_in(tmp_path: Path, name: str, body: str) -> str:
    tool = tmp_path / name
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)
    return str(tool)


def test_an_overflowing_set_is_its_own_error_and_the_other_sets_still_report(tmp_path: Path) -> None:
    # A stand-in netperf: the captured output for 127.0.0.1, a finite but enormous reading for 127.0.0.2.
    tool = _stand_in(tmp_path, "netperf", 'case "$2" in\n'
                     "  127.0.0.2) printf 'THROUGHPUT=1e308\\nTHROUGHPUT_UNITS=GBytes/s\\nELAPSED_TIME=1.00\\n';;\n"
                     f"  *) cat {TESTDATA / 'netperf_omni_k.txt'};;\nesac")
    sets = [{"name": "good", "targets": ["127.0.0.1"], "run_s": 1, "repetitions": 1},
            {"name": "bad", "targets": ["127.0.0.2"], "run_s": 1, "repetitions": 1}]
    rnd = build(Config(host="h", netperf_path=tool, target_sets=sets)).collect()
    [err] = rnd.errors
    assert err.target == "bad/127.0.0.2:12865" and err.kind == "parse" and "not a finite bit rate" in err.message
    [good] = only(rnd, SET_METRIC, target_set="good")
    assert good.fields["mean_gbps"] == pytest.approx(5.93208)
    [bad] = only(rnd, SET_METRIC, target_set="bad")
    assert bad.fields["runs"] == 0 and "mean_gbps" not in bad.fields


def test_iperf3_targets_whose_sum_overflows_are_a_parse_error_not_a_crash(tmp_path: Path) -> None:
    # Each target's iperf3 JSON is finite (1.5e308 bits/s), their sum is not.
    tool = _stand_in(tmp_path, "iperf3", "sed 's/\"bits_per_second\":[^,]*/\"bits_per_second\": 1.5e308/' "
                     f"{TESTDATA / 'iperf3_tcp_2streams.json'}")
    sets = [{"name": "big", "targets": ["127.0.0.1:5201", "127.0.0.2:5201"], "driver": "iperf3", "run_s": 1,
             "repetitions": 1}]
    rnd = build(Config(host="h", iperf3_path=tool, target_sets=sets)).collect()
    [err] = rnd.errors
    assert err.kind == "parse" and "sum to a non-finite bit rate" in err.message
    [s] = only(rnd, SET_METRIC)
    assert s.fields["failed_targets"] == 1 and s.fields["partial_mean_gbps"] == pytest.approx(1.5e299)
    assert s.fields["dead_targets"] == 0   # it answered: not dead, its runs stay partial


def test_a_set_whose_samples_break_the_wire_format_does_not_lose_the_others(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _stand_in(tmp_path, "netperf", f"cat {TESTDATA / 'netperf_omni_k.txt'}")
    sets = [{"name": "first", "targets": ["127.0.0.1"], "run_s": 1, "repetitions": 1},
            {"name": "second", "targets": ["127.0.0.2"], "run_s": 1, "repetitions": 1}]
    c = build(Config(host="h", netperf_path=tool, target_sets=sets))
    real = c._samples

    def samples(tset: TargetSet, *args: Any) -> list[Metric]:
        if tset.name == "first":
            raise WireError("fields.mean_gbps.float: not a finite number (got inf)")
        return real(tset, *args)

    monkeypatch.setattr(c, "_samples", samples)
    rnd = c.collect()
    [err] = rnd.errors
    assert err.target == "first" and err.kind == "parse" and "not a finite number" in err.message
    assert [m.tags["target_set"] for m in only(rnd, SET_METRIC)] == ["second"]


def test_rounds_never_overlap(netservers: list[Server]) -> None:
    c = collector(targets=targets(netservers[:1]), run_s=2, repetitions=1)
    first: list[Round] = []
    t = threading.Thread(target=lambda: first.append(c.collect()))
    t.start()
    try:
        wait_for(lambda: c.busy, "the first round to start")
        second = c.collect()
    finally:
        t.join()
    assert second.metrics == [] and "still running" in second.errors[0].message
    assert first[0].errors == [] and only(first[0], SET_METRIC)[0].fields["runs"] == 1


def test_a_set_with_an_interval_is_not_measured_again_before_it(netservers: list[Server]) -> None:
    c = collector(targets=targets(netservers[:1]), repetitions=1, interval_s=3600, jitter_s=60)
    assert only(c.collect(), SET_METRIC)
    again = c.collect()
    assert again.metrics == [] and again.errors == []


def test_round_deadline_bounds_the_repetitions(netservers: list[Server]) -> None:
    c = build(Config(max_round_s=2.5, target_sets=[{"name": "lo", "targets": targets(netservers[:1]),
                                                     "run_s": 1, "repetitions": 5}]))
    rnd = c.collect()
    [s] = only(rnd, SET_METRIC)
    # Each run lasts at least run_s, so no more than two fit before the deadline.
    assert 1 <= s.fields["runs"] < 5 and s.fields["runs_planned"] == 5
    [err] = rnd.errors
    assert err.kind == "timeout" and "max_round_s=2.5" in err.message


def test_a_set_the_round_deadline_left_unmeasured_is_measured_next_round(netservers: list[Server]) -> None:
    # "first" takes the whole round (its third run cannot start before max_round_s), so "second" gets no run.
    sets = [{"name": "first", "targets": targets(netservers[:1]), "run_s": 1, "repetitions": 3, "interval_s": 3600},
            {"name": "second", "targets": targets(netservers[1:]), "run_s": 1, "repetitions": 1, "interval_s": 3600}]
    c = build(Config(max_round_s=3.5, target_sets=sets))
    rnd = c.collect()
    [second] = only(rnd, SET_METRIC, target_set="second")
    assert second.fields["runs"] == 0
    assert any(e.target == "second" and e.kind == "timeout" and "0 of 1 runs" in e.message for e in rnd.errors)
    # Not measured is not done: it is still due (before, it waited interval_s, and every round the same).
    again = c.collect()
    assert [m.tags["target_set"] for m in only(again, SET_METRIC)] == ["second"]
    assert only(again, SET_METRIC)[0].fields["complete_runs"] == 1 and again.errors == []


def test_a_set_starved_by_an_earlier_one_goes_first_next_round(netservers: list[Server]) -> None:
    # Both measured every round; "first" alone fills max_round_s. "second" must not be left out for good.
    sets = [{"name": "first", "targets": targets(netservers[:1]), "run_s": 1, "repetitions": 3},
            {"name": "second", "targets": targets(netservers[1:]), "run_s": 1, "repetitions": 1}]
    c = build(Config(max_round_s=3.5, target_sets=sets))
    assert only(c.collect(), SET_METRIC, target_set="second")[0].fields["runs"] == 0
    [second] = only(c.collect(), SET_METRIC, target_set="second")
    assert second.fields["complete_runs"] == 1


def test_iperf3_driver_same_output(iperf3_servers: list[Server]) -> None:
    dead = f"127.0.0.1:{free_port()}"
    c = collector(driver="iperf3", targets=[*targets(iperf3_servers), dead], streams_per_target=2,
                  labels={"queues": 4})
    rnd = c.collect()
    [err] = rnd.errors
    assert err.target == f"lo/{dead}" and err.kind == "unreachable" and "Connection refused" in err.message
    [s] = only(rnd, SET_METRIC, driver="iperf3", queues="4")
    f = s.fields
    assert (f["runs"], f["targets"], f["failed_targets"], f["streams"]) == (2, 3, 1, 6)
    # One iperf3 process carries a target's two streams: the dead one fails both. Dead in every run, it is left
    # out: the runs of the two that answered are complete (test_dead_target.py).
    assert (f["streams_ok"], f["streams_attempted"], f["complete_runs"], f["dead_targets"]) == (8, 12, 2, 1)
    assert f["mean_gbps"] > 0 and "partial_mean_gbps" not in f and f["retransmits"] >= 0
    ok = [m for m in only(rnd, TARGET_METRIC) if m.tags["target"] != dead]
    assert len(ok) == 2 and all(m.fields["runs_ok"] == 2 for m in ok)


def test_cli_measures_once_and_exits_1_on_a_failed_target(netservers: list[Server], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text(yaml.safe_dump({"collectors": {"netperf": {"host": "cli", "target_sets": [
        {"name": "lo", "targets": [*targets(netservers[:1]), f"127.0.0.1:{free_port()}"], "run_s": 1,
         "repetitions": 1}]}}}))
    assert main(["--config", str(cfg)]) == 1
    lines = [yaml.safe_load(ln) for ln in capsys.readouterr().out.splitlines()]
    assert any(ln.get("name") == SET_METRIC and ln["tags"]["host"] == "cli" for ln in lines)
    assert any(ln.get("error", {}).get("kind") == "unreachable" for ln in lines)
