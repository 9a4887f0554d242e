"""Config validation, scheduling, statistics and argv building of the throughput collector (no tools)."""

from __future__ import annotations

import random
import statistics
import threading
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from opsloop.collectors.netperf import Config, build
from opsloop.collectors.netperf.cli import main
from opsloop.collectors.netperf.config import TargetSet, parse_target
from opsloop.collectors.netperf.drivers import Iperf3Driver, NetperfDriver
from opsloop.collectors.netperf.schedule import JitterSchedule, RoundGuard
from opsloop.collectors.netperf.stats import summarize
from tests.helpers import REPO

SAMPLE = REPO / "collectors" / "netperf" / "sample.yaml"


def one_set(**kw: object) -> dict:
    return {"name": "s", "targets": ["127.0.0.1"], **kw}


def test_sample_yaml_is_valid() -> None:
    doc = yaml.safe_load(SAMPLE.read_text())
    cfg = Config.model_validate(doc["collectors"]["netperf"])
    first = cfg.target_sets[0]
    assert len(first.targets) == 6 and first.repetitions == 10  # the published measurement
    assert first.labels["queues"] == "8"  # YAML int label became a tag string
    assert build(cfg).name == "netperf"


@pytest.mark.parametrize("spec, host, port", [
    ("10.0.0.1", "10.0.0.1", 12865), ("10.0.0.1:9", "10.0.0.1", 9), ("vm-1.example.net", "vm-1.example.net", 12865),
    ("[2001:db8::1]:5201", "2001:db8::1", 5201), ("2001:db8::1", "2001:db8::1", 12865), ("[::1]", "::1", 12865),
])
def test_targets_parse(spec: str, host: str, port: int) -> None:
    t = parse_target(spec, 12865)
    assert (t.host, t.port) == (host, port)


@pytest.mark.parametrize("section, needle", [
    ({"target_sets": [one_set(targets=["10.0.0.1:99999"])]}, "port '99999'"),
    ({"target_sets": [one_set(targets=["bad host!"])]}, "neither an IP address nor a host name"),
    ({"target_sets": [one_set(targets=["[::1"])]}, "unclosed"),
    ({"target_sets": [one_set(targets=[])]}, "target_sets.0.targets"),
    ({"target_sets": [one_set(targets=["10.0.0.1", "10.0.0.1"])]}, "listed twice"),
    ({"target_sets": [one_set(run_s=0.5)]}, "target_sets.0.run_s"),
    ({"target_sets": [one_set(run_s=0)]}, "target_sets.0.run_s"),
    ({"target_sets": [one_set(labels={"host": "x"})]}, "set by the collector itself"),
    ({"target_sets": [one_set(labels={"bad-key": "x"})]}, "label 'bad-key'"),
    ({"target_sets": [one_set(driver="ping")]}, "target_sets.0.driver"),
    ({"target_sets": [one_set(driver="iperf3", data_port=5000)]}, "netperf driver only"),
    ({"target_sets": [one_set(), one_set()]}, "duplicate name(s) ['s']"),
    ({"target_sets": [one_set(streams_per_target=8)], "max_processes": 4}, "exceed max_processes=4"),
    ({"target_sets": [one_set(repetitons=3)]}, "repetitons"),
    ({"target_sets": []}, "target_sets"),
    ({"target_sets": [one_set()], "colour": "red"}, "colour"),
])
def test_validation_errors_name_the_field(section: dict, needle: str) -> None:
    with pytest.raises(ValidationError) as e:
        Config.model_validate(section)
    assert needle in str(e.value)


def test_iperf3_streams_share_one_process_per_target() -> None:
    s = TargetSet(name="x", targets=["10.0.0.1", "10.0.0.2"], driver="iperf3", streams_per_target=8)
    assert s.streams == 16 and s.processes == 2
    Config(target_sets=[s], max_processes=2)  # fits: one process per target


def test_netperf_argv_is_explicit_and_pins_data_ports() -> None:
    s = TargetSet(name="x", targets=["10.0.0.1:12866"], run_s=3, data_port=40000, streams_per_target=2)
    t = s.parsed_targets()[0]
    argv = NetperfDriver("/usr/bin/netperf").argv(s, t, 1)
    assert argv[:9] == ["/usr/bin/netperf", "-H", "10.0.0.1", "-p", "12866", "-t", "TCP_STREAM", "-l", "3"]
    assert argv[argv.index("--"):] == ["--", "-k", "THROUGHPUT,THROUGHPUT_UNITS,ELAPSED_TIME,PROTOCOL",
                                       "-P", ",40001"]
    assert ["-P", "0"] == argv[9:11]  # no banner


def test_iperf3_argv() -> None:
    s = TargetSet(name="x", targets=["[2001:db8::2]"], driver="iperf3", run_s=2, streams_per_target=4)
    argv = Iperf3Driver().argv(s, s.parsed_targets()[0], 0)
    assert argv[:8] == ["iperf3", "-c", "2001:db8::2", "-p", "5201", "-t", "2", "-J"]
    assert argv[argv.index("-P") + 1] == "4"


def test_summary_of_the_old_kernel_figures() -> None:
    figures = [3.28, 3.41, 3.51, 3.57]
    s = summarize(figures)
    assert s is not None
    assert (s.n, s.minimum, s.maximum) == (4, 3.28, 3.57)
    assert s.mean == pytest.approx(sum(figures) / 4)
    assert s.stddev == pytest.approx(statistics.stdev(figures))
    assert summarize([8.42]).stddev == 0.0  # type: ignore[union-attr]
    assert summarize([]) is None


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_schedule_first_due_then_interval_plus_jitter() -> None:
    clock = FakeClock()
    sched = JitterSchedule(60.0, 30.0, clock, random.Random(7))
    assert sched.due()
    sched.done()
    assert sched.next_due is not None and 1060.0 <= sched.next_due <= 1090.0
    clock.now = 1059.9
    assert not sched.due()
    clock.now = sched.next_due
    assert sched.due()


def test_schedule_jitter_spreads_collectors() -> None:
    dues = set()
    for seed in range(20):
        s = JitterSchedule(60.0, 30.0, FakeClock(), random.Random(seed))
        s.done()
        dues.add(s.next_due)
    assert len(dues) > 10


def test_schedule_without_interval_is_always_due() -> None:
    s = JitterSchedule(None, 10.0, FakeClock())
    s.done()
    assert s.due()


def test_round_guard_refuses_overlap_in_process_and_across_lock_file(tmp_path: Path) -> None:
    lock = str(tmp_path / "np.lock")
    a, b = RoundGuard(lock), RoundGuard(lock)  # two collectors, one host
    with a.hold() as first:
        assert first and a.busy
        with a.hold() as again:
            assert not again
        seen: list[bool] = []

        def other() -> None:
            with b.hold() as got:
                seen.append(got)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert seen == [False]
    with b.hold() as after:
        assert after


def test_cli_check_and_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(SAMPLE), "--check"]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"collectors": {"netperf": {"target_sets": [one_set(run_s=-1)]}}}))
    assert main(["--config", str(bad)]) == 2
    assert "target_sets.0.run_s" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "examples:" in capsys.readouterr().out
