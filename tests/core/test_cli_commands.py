"""The command-line defects an on-call engineer hit, one test each: what `run --help` says it starts,
`stack status` for people, `stack up` progress, where `sim --plot` writes and how `sim` prints fractions,
and `collect --once` with nothing to collect."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from opsloop.collect.cli import once_status
from opsloop.collect.types import CollectError, Round
from opsloop.config import Settings, StackSettings, collector_names
from opsloop.lab.pipeline import pipeline_processes
from opsloop.stack import Stack, free_port
from opsloop.stack.manager import RELOAD_ON_SIGHUP
from opsloop.stack.process import write_pidfile
from tests.helpers import REPO, run_cli, write_config

SCENARIOS = REPO / "controllers" / "edge" / "scenarios"


def test_run_help_names_every_process_it_starts(tmp_path: Path) -> None:
    settings = Settings()
    expected = Stack(settings.stack).component_names() + [
        p.name for p in pipeline_processes(settings, tmp_path / "opsloop.yaml", tmp_path, 0.0)]
    r = run_cli("run", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # the list is wrapped
    assert f"It starts {len(expected)} processes, in this order: {', '.join(expected)}." in text


def _stack_config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "opsloop.yaml", {"stack": {
        "data_dir": str(tmp_path / "stack"), "kafka_port": free_port(), "kafka_controller_port": free_port(),
        "prometheus_port": free_port(), "alertmanager_port": free_port(), "scrape_targets": []}})


def test_stack_status_is_a_table_not_a_python_dict(tmp_path: Path) -> None:
    cfg = _stack_config(tmp_path)
    # a live process recorded as the broker (what status reads: the pidfile), no real Kafka needed
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        pidfile = tmp_path / "stack" / "kafka" / "kafka.pid"
        pidfile.parent.mkdir(parents=True)
        write_pidfile(pidfile, sleeper.pid)
        r = run_cli("stack", "status", "--config", str(cfg))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["COMPONENT", "STATE", "PID", "PORTS", "LOG"]
        rows = {line.split()[0]: line for line in lines[1:]}
        assert set(rows) == {"kafka", "alertmanager", "prometheus"}
        assert rows["kafka"].split()[1:3] == ["running", str(sleeper.pid)]
        assert rows["prometheus"].split()[1:3] == ["stopped", "-"]
        assert not re.search(r"[{}']", r.stdout), "a Python dict or repr in the table"
        st = orjson.loads(run_cli("stack", "status", "--json", "--config", str(cfg)).stdout)
        assert st["kafka"]["running"] is True and st["kafka"]["pid"] == sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.integration
def test_stack_up_reports_each_component_as_it_becomes_ready(tmp_path: Path) -> None:
    cfg = _stack_config(tmp_path)
    names = Stack(StackSettings()).component_names()
    proc = subprocess.Popen([sys.executable, "-m", "opsloop.cli", "stack", "up", "--config", str(cfg)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        # read progress as it comes: the first component's "ready" arrives while the next one is not started
        first = [proc.stderr.readline().split() for _ in range(2)]
        assert first == [[names[0], "starting", "..."], [names[0], "ready", "after", first[1][3], "s"]]
        # Not communicate(): it reads the pipes' file descriptors directly and would lose what readline()
        # already buffered (the next component's "starting" line often arrives with the first "ready").
        err = proc.stderr.read()
        assert proc.stdout is not None
        out = proc.stdout.read()
        assert proc.wait(timeout=300) == 0, err
        events = [line.split()[:2] for line in err.splitlines()]
        assert events == [[n, e] for n in names[1:] for e in ("starting", "ready")]
        assert [line.split()[0] for line in out.splitlines()[:len(names)]] == names
        again = run_cli("stack", "up", "--config", str(cfg), timeout=180)
        assert again.returncode == 0
        # a running Prometheus/Alertmanager is reloaded with the config `up` just wrote (opsloop run reuses a stack)
        assert [line.split(None, 1) for line in again.stderr.splitlines()] == [
            [n, e] for n in names
            for e in (("already running", "config reloaded") if n in RELOAD_ON_SIGHUP else ("already running",))]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert run_cli("stack", "down", "--config", str(cfg), timeout=120).returncode == 0


def test_sim_plot_says_where_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from opsloop.controllers.edge.sim_cli import main

    scenario = str(SCENARIOS / "capacity_drop.yaml")
    monkeypatch.chdir(tmp_path)
    assert main(["--scenario", scenario, "--controllers", "ours", "--plot"]) in (0, 1)
    default = tmp_path / "capacity_drop.png"
    assert default.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {default}" in capsys.readouterr().err
    chosen = tmp_path / "sub" / "mine.png"
    chosen.parent.mkdir()
    assert main(["--scenario", scenario, "--controllers", "ours", "--json", "--plot", str(chosen)]) in (0, 1)
    cap = capsys.readouterr()
    assert chosen.is_file() and f"plot written to {chosen}" in cap.err
    orjson.loads(cap.out)  # stdout stays the JSON document
    assert main(["--scenario", scenario, "--plot", str(tmp_path / "missing" / "x.png")]) == 2
    assert "cannot write plot" in capsys.readouterr().err


def test_sim_table_prints_every_fraction_as_a_percentage(capsys: pytest.CaptureFixture[str]) -> None:
    from opsloop.controllers.edge.sim_cli import main

    # the fixed-step baseline misses targets here, so the misses are printed too
    assert main(["--scenario", str(SCENARIOS / "demand_surge.yaml"), "--controllers", "ours,fixed-step"]) in (0, 1)
    table = capsys.readouterr().out
    assert "MISSES targets" in table
    # every decimal number carries its unit: %, ms or s (scenario labels such as "x1.6" are factors)
    bare = [m.group(0) for m in re.finditer(r"(?<![\w.])(?<!x)\d+\.\d+(?![\d%]| ?m?s\b)", table)]
    assert bare == [], f"numbers without a unit in the sim table: {bare}"
    header = next(line for line in table.splitlines() if line.startswith("controller"))
    rows = [line.split() for line in table.splitlines() if line.startswith(("ours ", "fixed-step "))
            and "@" in line]
    assert rows and "osc w" in header
    for row in rows:  # ... overshoot, settle, osc w, osc load, then the per-origin overload (origin=Ns)
        at = next(i for i, cell in enumerate(row) if "=" in cell)
        overshoot, settle, osc_w, osc_load = row[at - 4:at]
        assert (overshoot.endswith("%") or overshoot == "never") and osc_w.endswith("%") and osc_load.endswith("%"), row
        assert settle.endswith("s") or settle == "never", row
        assert all(cell.endswith("s") for cell in row[at:]), row


def test_collect_without_configuration_names_what_is_missing() -> None:
    r = run_cli("collect", "haproxy", "--once", "--stdout")
    assert r.returncode == 78 and r.stdout == ""   # EX_CONFIG: the collector's configuration, not its command line
    assert "collectors.haproxy.instances" in r.stderr and "collectors/haproxy/sample.yaml" in r.stderr


@pytest.mark.parametrize("name", collector_names())
def test_no_collector_prints_nothing_and_succeeds(name: str, tmp_path: Path) -> None:
    # with no configuration a collector either collects from its local default target or says why not
    r = run_cli("collect", name, "--once", "--stdout", "--config", str(write_config(tmp_path / "c.yaml", {})))
    if r.returncode == 0:
        assert r.stdout.strip(), f"{name}: exit 0 with nothing printed"
    else:
        assert r.stderr.startswith(f"opsloop collect {name}: ") and "Traceback" not in r.stderr, r.stderr


def test_collect_once_fails_when_a_target_fails(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", {"collectors": {"haproxy": {
        "instances": {"gone": str(tmp_path / "no.sock")}}}})
    r = run_cli("collect", "haproxy", "--once", "--stdout", "--config", str(cfg))
    assert r.returncode == 1
    assert orjson.loads(r.stdout.splitlines()[0])["error"]["target"] == "gone"  # the per-target line stays
    assert "1 target(s) failed: gone: unreachable" in r.stderr


def test_collect_not_a_collector_is_refused() -> None:
    r = run_cli("collect", "telegraf", "--once", "--stdout")  # a folder of Telegraf configuration
    assert r.returncode == 2 and "invalid choice: 'telegraf'" in r.stderr and "'haproxy'" in r.stderr


def test_once_status_of_an_empty_round(capsys: pytest.CaptureFixture[str]) -> None:
    assert once_status("lvs", Round()) == 1
    assert "collected no sample" in capsys.readouterr().err
    assert once_status("lvs", Round(errors=[CollectError("h", "timeout", "slow")])) == 1
    assert once_status("lvs", Round(metrics=[object()])) == 0  # type: ignore[list-item]

