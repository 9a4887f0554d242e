"""The IPMI collector with real ipmitool against simulated BMCs (OpenIPMI ipmi_sim on loopback)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from collections.abc import Iterator

import pytest
import yaml

from opsloop.collectors.ipmi import Config, build
from opsloop.lab.bmcsim import BMCFleet, BMCSpec
from opsloop.lab.bmcsim.procs import live_children
from opsloop.collectors.ipmi.collector import IpmiCollector
from opsloop.collect.types import Round
from tests.helpers import REPO

pytestmark = pytest.mark.integration

TESTDATA = REPO / "collectors" / "ipmi" / "testdata"

# "(Ceph) storage (server) power usage": three server generations drew 248 W, 205 W and 155 W under light load.
SPECS = [
    BMCSpec("stor-g1", watts=248),
    BMCSpec("stor-g2", watts=205),
    BMCSpec("stor-g3", watts=155),
    BMCSpec("sdr-only", dcmi=False, watts=205),
    BMCSpec("no-reading", dcmi=False, sdr_power=False, sdr_no_reading=True),
    BMCSpec("deactivated", watts="na", sdr_power=False),
    BMCSpec("dead", dead=True),
]
METADATA = {
    "stor-g1": {"generation": "gen1", "raw_capacity_tb": 48, "disks": 12, "role": "ceph-osd"},
    "stor-g3": {"generation": "gen3", "raw_capacity_tb": 144, "disks": 12, "role": "ceph-osd"},
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BMCFleet]:
    with BMCFleet(SPECS, tmp_path_factory.mktemp("bmcs")) as f:
        yield f


def collector_for(fleet: BMCFleet, tmp_path: Path, names: list[str] | None = None, **settings: object) -> IpmiCollector:
    inv = fleet.inventory(METADATA)
    if names is not None:  # in the order given: with one worker, that is the reading order
        by_name = {h["name"]: h for h in inv["hosts"]}
        inv["hosts"] = [by_name[n] for n in names]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv))
    return build(Config.model_validate({"inventory": str(path), "timeout_s": 8, **settings}))


def power(rnd: Round) -> dict[str, dict]:
    return {m.tags["host"]: {"tags": m.tags, "fields": m.fields, "ts": m.timestamp}
            for m in rnd.metrics if m.name == "ipmi_power"}


def errors(rnd: Round) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for e in rnd.errors:
        out.setdefault(e.target, []).append((e.kind, e.message))
    return out


def status(rnd: Round) -> dict[str, dict]:
    return {m.tags["host"]: {**m.fields, "ts": m.timestamp} for m in rnd.metrics if m.name == "ipmi_bmc"}


# --- one round over the whole fleet ----------------------------------------------------------------

@pytest.fixture(scope="module")
def first_round(fleet: BMCFleet, tmp_path_factory: pytest.TempPathFactory) -> Round:
    # -N 2: the dead BMC takes >= 4 s to give up, a wide margin over the live reads on a busy machine.
    return collector_for(fleet, tmp_path_factory.mktemp("inv"), retransmit_timeout_s=2, timeout_s=12).collect()


def test_several_bmcs_read_in_one_round(first_round: Round) -> None:
    p = power(first_round)
    assert {h: p[h]["fields"]["watts"] for h in ("stor-g1", "stor-g2", "stor-g3")} == {
        "stor-g1": 248.0, "stor-g2": 205.0, "stor-g3": 155.0}
    assert all(p[h]["tags"]["source"] == "dcmi" for h in ("stor-g1", "stor-g2", "stor-g3"))
    assert p["stor-g1"]["fields"]["watts_avg"] == 248.0


def test_samples_carry_metadata_tags_with_host_first(first_round: Round) -> None:
    tags = power(first_round)["stor-g1"]["tags"]
    assert list(tags)[0] == "host"
    assert tags == {"host": "stor-g1", "source": "dcmi", "generation": "gen1", "role": "ceph-osd",
                    "disks": "12", "raw_capacity_tb": "48"}
    assert all(m.topic.value == "telemetry.ipmi" for m in first_round.metrics)
    # keyed by the generation where the inventory names one (its servers compared together reach one stream
    # worker: opsloop.topics.TOPIC_KEY_TAGS), by the host otherwise
    keys = {m.tags["host"]: m.key for m in first_round.metrics}
    assert keys == {h: METADATA.get(h, {}).get("generation", h) for h in keys}
    assert keys["stor-g1"] == "gen1" and keys["stor-g3"] == "gen3" and keys["stor-g2"] == "stor-g2"


def test_bmc_without_dcmi_falls_back_to_sdr(first_round: Round) -> None:
    p = power(first_round)["sdr-only"]
    assert p["fields"]["watts"] == 205.0
    assert (p["tags"]["source"], p["tags"]["sensor"]) == ("sdr", "Pwr Consumption")
    assert "sdr-only" not in errors(first_round)  # falling back is not an error
    assert status(first_round)["sdr-only"]["ipmitool_calls"] == 2  # DCMI probe, then SDR


def test_sensor_without_reading_is_reported(first_round: Round) -> None:
    errs = errors(first_round)
    assert errs["no-reading"] == [("no_reading", "SDR sensor 'PSU2 Power' has no reading (status ns)")]
    kind, message = errs["deactivated"][0]
    assert kind == "no_reading" and "deactivated" in message
    assert "no-reading" not in power(first_round) and "deactivated" not in power(first_round)
    assert status(first_round)["no-reading"]["up"] is False


def test_dead_bmc_is_unreachable_and_delays_nobody(first_round: Round) -> None:
    (kind, message), = errors(first_round)["dead"]
    assert kind == "unreachable"
    assert "did not answer" in message
    st = status(first_round)
    assert st["dead"]["up"] is False and st["dead"]["error_kind"] == "unreachable"
    # The live BMCs were all read before the dead one gave up (order of events, not durations).
    p = power(first_round)
    assert max(v["ts"] for v in p.values()) < st["dead"]["ts"]


def test_every_bmc_has_a_status_sample(first_round: Round) -> None:
    assert set(status(first_round)) == {s.name for s in SPECS}


# --- rounds over time ---------------------------------------------------------------------------

def test_power_jump_is_seen_in_the_next_round(fleet: BMCFleet, tmp_path: Path) -> None:
    collector = collector_for(fleet, tmp_path, ["stor-g3"])
    fleet["stor-g3"].set_watts(155)
    assert power(collector.collect())["stor-g3"]["fields"]["watts"] == 155.0
    fleet["stor-g3"].set_watts(248)
    try:
        assert power(collector.collect())["stor-g3"]["fields"]["watts"] == 248.0
    finally:
        fleet["stor-g3"].set_watts(155)


def test_sdr_power_change_is_read_and_dcmi_probe_is_skipped(fleet: BMCFleet, tmp_path: Path) -> None:
    collector = collector_for(fleet, tmp_path, ["sdr-only"])
    bmc = fleet["sdr-only"]
    first = collector.collect()
    assert status(first)["sdr-only"]["ipmitool_calls"] == 2
    bmc.set_watts(136)  # an idle Gen-3 box (docs/sources.md)
    try:
        # The simulator polls the file every 200 ms; read rounds until the new value shows.
        seen = []
        for _ in range(50):
            rnd = collector.collect()
            assert status(rnd)["sdr-only"]["ipmitool_calls"] == 1  # no DCMI probe for 30 rounds
            seen.append(power(rnd)["sdr-only"]["fields"]["watts"])
            if seen[-1] == 136.0:
                break
        assert seen[-1] == 136.0
        assert set(seen) <= {205.0, 136.0}
    finally:
        bmc.set_watts(205)


def test_wrong_password_is_an_auth_error_without_the_secret(fleet: BMCFleet, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong-pw"
    wrong.write_text("Wr0ng-Passw0rd\n")
    wrong.chmod(0o600)
    inv = {"hosts": [{**fleet["stor-g1"].inventory_entry(), "password_file": str(wrong)}]}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(inv))
    rnd = build(Config(inventory=path)).collect()
    (kind, message), = errors(rnd)["stor-g1"]
    assert kind == "auth"
    assert "wrong user name or password" in message
    assert "Wr0ng-Passw0rd" not in message and fleet["stor-g1"].spec.password not in message
    assert power(rnd) == {}


def test_a_fifo_as_password_file_fails_that_host_and_the_round_ends(fleet: BMCFleet, tmp_path: Path) -> None:
    fifo = tmp_path / "pw.fifo"
    os.mkfifo(fifo, 0o600)   # nobody writes: the old open() waited for ever, and the round with it
    inv = {"hosts": [{**fleet["stor-g1"].inventory_entry(), "password_file": str(fifo)},
                     fleet["stor-g2"].inventory_entry()]}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(inv))
    rounds: list[Round] = []
    t = threading.Thread(target=lambda: rounds.append(build(Config(inventory=path, timeout_s=8)).collect()),
                         daemon=True)
    t.start()
    t.join(60)   # a deadline for waiting, far above a round of two BMCs
    if t.is_alive():   # release the blocked reader so the thread ends, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(60)
        pytest.fail("collect() blocked on the FIFO password file")
    [rnd] = rounds
    (kind, message), = errors(rnd)["stor-g1"]
    assert kind == "auth" and "not a regular file" in message
    assert power(rnd)["stor-g2"]["fields"]["watts"] == 205.0


def test_forced_dcmi_on_a_bmc_without_it_is_unsupported(fleet: BMCFleet, tmp_path: Path) -> None:
    inv = {"hosts": [{**fleet["sdr-only"].inventory_entry(), "source": "dcmi"}]}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(inv))
    (kind, message), = errors(build(Config(inventory=path)).collect())["sdr-only"]
    assert kind == "unsupported" and "(c1)" in message


def test_hung_bmc_is_killed_at_its_timeout(fleet: BMCFleet, tmp_path: Path) -> None:
    # ipmitool itself would wait -N 5 x (-R 3 + 1) = 20 s; the per-BMC timeout ends it first.
    collector = collector_for(fleet, tmp_path, ["stor-g2", "stor-g1"], timeout_s=3,
                              retransmit_timeout_s=5, retries=3, concurrency=2)
    bmc = fleet["stor-g2"]
    bmc.pause()
    try:
        rnd = collector.collect()
    finally:
        bmc.resume()
    (kind, message), = errors(rnd)["stor-g2"]
    assert kind == "timeout" and "killed" in message
    assert power(rnd)["stor-g1"]["fields"]["watts"] == 248.0
    assert ipmitool_children() == []


# --- processes and secrets ----------------------------------------------------------------------

def ipmitool_children() -> list[int]:
    """ipmitool processes whose parent is this test process."""
    return live_children("ipmitool")


def test_concurrency_bound_and_no_secret_in_argv(fleet: BMCFleet, tmp_path: Path) -> None:
    collector = collector_for(fleet, tmp_path, concurrency=2)
    peak, argvs, envs = 0, [], []
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            pids = ipmitool_children()
            peak = max(peak, len(pids))
            for pid in pids:
                try:
                    argv = open(f"/proc/{pid}/cmdline", "rb").read()
                    env = open(f"/proc/{pid}/environ", "rb").read()
                except OSError:
                    continue
                if argv:  # empty while the process is exiting
                    argvs.append(argv)
                    envs.append(env)
            stop.wait(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        rnd = collector.collect()
    finally:
        stop.set()
        sampler.join()
    assert len(power(rnd)) == 4
    assert 1 <= peak <= 2
    password = fleet["stor-g1"].spec.password.encode()
    assert argvs and all(password not in a for a in argvs)
    assert any(b"IPMI_PASSWORD=" + password in e for e in envs)
    assert all(b"-E" in a.split(b"\0") for a in argvs)
    assert ipmitool_children() == []


def test_garbage_from_the_tool_is_a_parse_error_with_first_bytes(tmp_path: Path) -> None:
    # A stand-in ipmitool that prints what a broken BMC/tool might: garbage, then a captured short reply.
    for case, expected in [("echo '<html><body>Service Unavailable</body></html>'", "<html><body>Service"),
                           (f"cat {TESTDATA / 'dcmi_short_reply.stdout'}", "max_plausible_watts")]:
        tool = tmp_path / "ipmitool"
        tool.write_text(f"#!/bin/bash\n{case}\n")
        tool.chmod(0o755)
        collector = build(Config.model_validate(
            {"hosts": [{"name": "weird", "bmc": "127.0.0.1", "source": "dcmi"}], "ipmitool": str(tool)}))
        (kind, message), = errors(collector.collect())["weird"]
        assert kind == "parse"
        assert expected in message


def test_negative_sdr_watts_is_a_parse_error_not_the_total(tmp_path: Path) -> None:
    # A stand-in ipmitool whose SDR list has a garbled (negative) PSU reading next to a good one.
    tool = tmp_path / "ipmitool"
    tool.write_text("#!/bin/bash\n"
                    "echo 'PSU1 Input Power,-3276,Watts,ok,10.1,Power Supply,Current,,,,,,,,,,0.000,255.000'\n"
                    "echo 'PSU2 Input Power,240,Watts,ok,10.2,Power Supply,Current,,,,,,,,,,0.000,255.000'\n")
    tool.chmod(0o755)
    collector = build(Config.model_validate(
        {"hosts": [{"name": "psu", "bmc": "127.0.0.1", "source": "sdr"}], "ipmitool": str(tool)}))
    rnd = collector.collect()
    (kind, message), = errors(rnd)["psu"]
    assert kind == "parse"
    assert "'PSU1 Input Power' reads -3276 Watts" in message
    assert "psu" not in power(rnd)
    assert status(rnd)["psu"]["up"] is False


def test_slow_bmcs_start_first_in_the_next_round(fleet: BMCFleet, tmp_path: Path) -> None:
    # The BMCs that did not answer start first next round, so the dead one's timeout overlaps the quick
    # reads (ranked by not answering, not by its 2 s against a live read's 0.05 s: one retransmit on a
    # loaded machine made a live read as slow, and this test failed in CI on it).
    collector = collector_for(fleet, tmp_path, ["stor-g1", "stor-g2", "dead"], concurrency=1)
    first = [m.tags["host"] for m in collector.collect().metrics if m.name == "ipmi_bmc"]
    second = [m.tags["host"] for m in collector.collect().metrics if m.name == "ipmi_bmc"]
    assert first[-1] == "dead"
    assert second[0] == "dead"


def test_a_live_bmcs_slow_read_does_not_outrank_a_dead_one(fleet: BMCFleet, tmp_path: Path) -> None:
    # The CI failure of the test above, made certain: stor-g1's first read is slowed by 4 s (a
    # stand-in that waits, then runs the real ipmitool: a loaded machine), longer than the dead
    # BMC's 2 s (-N 1 -R 1). It still answers, so the dead BMC starts first next round all the same.
    real = shutil.which("ipmitool")
    assert real, "ipmitool is not installed (make setup)"
    flag = tmp_path / "slowed-once"
    tool = tmp_path / "ipmitool"
    tool.write_text(f"#!/bin/bash\nif [[ \" $* \" == *\" -p {fleet['stor-g1'].port} \"* && ! -e {flag} ]]; then\n"
                    f"  touch {flag}; sleep 4\nfi\nexec {real} \"$@\"\n")
    tool.chmod(0o755)
    collector = collector_for(fleet, tmp_path, ["stor-g1", "stor-g2", "dead"], concurrency=1, ipmitool=str(tool))
    first = collector.collect()
    assert flag.exists() and power(first)["stor-g1"]["fields"]["watts"] == 248.0
    second = [m.tags["host"] for m in collector.collect().metrics if m.name == "ipmi_bmc"]
    assert second[0] == "dead" and sorted(second) == ["dead", "stor-g1", "stor-g2"]


def test_round_deadline_bounds_the_round(fleet: BMCFleet, tmp_path: Path) -> None:
    # One worker, the dead BMC first: it is cut at the round deadline, and the next BMC is
    # reported as not read instead of stretching the round.
    collector = collector_for(fleet, tmp_path, ["dead", "stor-g1"], concurrency=1, round_timeout_s=0.5)
    rnd = collector.collect()
    errs = errors(rnd)
    assert errs["dead"][0][0] == "timeout" and "killed" in errs["dead"][0][1]
    assert errs["stor-g1"] == [("timeout", "not read: the round passed round_timeout_s=0.5 before this BMC's turn")]
    assert status(rnd)["stor-g1"]["up"] is False
    assert ipmitool_children() == []


def test_a_bmc_not_read_for_the_round_deadline_starts_first_next_round(fleet: BMCFleet, tmp_path: Path) -> None:
    # Dead BMCs that alone fill the round (here one worker, and -N 10: the dead one would wait far past the
    # round's deadline) pushed the live BMCs behind them out of every round, for ever: the not-read ranked
    # behind "did not answer". Not read this round means first in the next.
    collector = collector_for(fleet, tmp_path, ["dead", "stor-g1"], concurrency=1, round_timeout_s=5,
                              timeout_s=60, retransmit_timeout_s=10)
    first = collector.collect()
    assert errors(first)["stor-g1"] == [("timeout", "not read: the round passed round_timeout_s=5 before this "
                                                    "BMC's turn")]
    second = collector.collect()
    assert [m.tags["host"] for m in second.metrics if m.name == "ipmi_bmc"] == ["stor-g1", "dead"]
    assert power(second)["stor-g1"]["fields"]["watts"] == 248.0 and "stor-g1" not in errors(second)
    assert errors(second)["dead"][0][0] == "timeout"   # still started, cut at the round's deadline
    assert ipmitool_children() == []


def test_an_implausible_sdr_sensor_fails_the_host_before_any_of_its_sensors_is_kept(tmp_path: Path) -> None:
    # A garbled dump: a good PSU first, then one far above max_plausible_watts. The host's round fails whole;
    # the good PSU's reading from the same garbled reply is not published as a sample either.
    tool = tmp_path / "ipmitool"
    tool.write_text("#!/bin/bash\n"
                    "echo 'PSU1 Input Power,240,Watts,ok,10.1,Power Supply,Current,,,,,,,,,,0.000,255.000'\n"
                    "echo 'PSU2 Input Power,65280,Watts,ok,10.2,Power Supply,Current,,,,,,,,,,0.000,255.000'\n")
    tool.chmod(0o755)
    collector = build(Config.model_validate(
        {"hosts": [{"name": "psu", "bmc": "127.0.0.1", "source": "sdr"}], "ipmitool": str(tool)}))
    rnd = collector.collect()
    (kind, message), = errors(rnd)["psu"]
    assert kind == "parse" and "'PSU2 Input Power' reads 65280 W" in message
    assert [m for m in rnd.metrics if m.name.startswith("ipmi_power") and m.tags.get("host") == "psu"] == []
    assert status(rnd)["psu"]["up"] is False
