"""`opsloop detect evaluate` on the layouts of public anomaly benchmarks: SKAB's (';', eight channels,
`anomaly` and `changepoint`), Yahoo S5's (`is_anomaly`) and NAB's (labels in combined_windows.json).
The files here are generated in those layouts (the corpora themselves are never copied into the
repository); the header lines are the benchmarks' own."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from opsloop.streams.detectors.cli import main as detect_main
from opsloop.streams.detectors.labelled_csv import read_labelled, read_windows_json, windows_for
from opsloop.streams.detectors.replay_cli import ReplayError

SKAB_HEADER = ("datetime;Accelerometer1RMS;Accelerometer2RMS;Current;Pressure;Temperature;Thermocouple;Voltage;"
               "Volume Flow RateRMS;anomaly;changepoint")
N = 1200
FAULT = range(900, 980)


def _skab(path: Path, fault_channel: int | None = 2, labelled: bool = True) -> Path:
    """A SKAB-layout experiment: eight quiet channels; a fault steps one of them at rows 900-979."""
    header = SKAB_HEADER if labelled else SKAB_HEADER.rsplit(";", 2)[0]
    lines = [header]
    for i in range(N):
        vals = [10.0 * (c + 1) + 0.05 * math.sin(i * (c + 1) / 7.0) for c in range(8)]
        inside = i in FAULT
        if inside and fault_channel is not None:
            vals[fault_channel] += 25.0
        row = [f"2020-03-09 10:{i // 60 % 60:02d}:{i % 60:02d}".replace("10:", f"{10 + i // 3600}:", 1)]
        row += [f"{v:.6f}" for v in vals]
        if labelled:
            row += ["1" if inside else "0", "1" if i in (FAULT.start, FAULT.stop - 1) else "0"]
        lines.append(";".join(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_skab_file_is_read_with_every_channel_and_its_anomaly_column(tmp_path: Path) -> None:
    got = read_labelled(_skab(tmp_path / "0.csv"))
    assert list(got.channels) == SKAB_HEADER.split(";")[1:9]           # changepoint is not a channel
    assert len(got.timestamps) == N and got.labels is not None and sum(got.labels) == len(FAULT)
    assert got.timestamps[1] - got.timestamps[0] == pytest.approx(1.0)


def test_a_fault_in_one_channel_is_found_by_the_max_over_channels(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    f = _skab(tmp_path / "0.csv", fault_channel=5)
    assert detect_main(["evaluate", "--input", str(f), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["events"][0]["detected"] and doc["profiles"][0]["score"] > 80
    # Only a channel the fault does not touch: nothing to find (the channel choice is really applied).
    assert detect_main(["evaluate", "--input", str(f), "--column", "Current", "--json"]) == 0
    assert not json.loads(capsys.readouterr().out)["events"][0]["detected"]


def test_a_corpus_with_an_unlabelled_file_scores_it_as_anomaly_free(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "valve1").mkdir()
    (tmp_path / "valve2").mkdir()
    a, b = _skab(tmp_path / "valve1" / "0.csv"), _skab(tmp_path / "valve2" / "0.csv", fault_channel=1)
    free = _skab(tmp_path / "anomaly-free.csv", fault_channel=None, labelled=False)
    assert detect_main(["evaluate", "--input", str(a), str(b), str(free), "--json"]) == 0
    out = capsys.readouterr()
    assert "anomaly-free.csv: no label column: scored as anomaly-free" in out.err
    doc = json.loads(out.out)
    assert {e["series"] for e in doc["events"]} == {"valve1/0", "valve2/0"}      # same stems told apart
    assert doc["windows"] == 2
    # Alone, an unlabelled file is an error: nothing to score against.
    assert detect_main(["evaluate", "--input", str(free)]) == 2
    assert "no label column" in capsys.readouterr().err


def test_yahoo_s5_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["timestamp,value,is_anomaly"]
    for i in range(1, N + 1):
        spike = i in (1000, 1001)
        lines.append(f"{i},{(400.0 if spike else 100.0) + (i % 5)},{1 if spike else 0}")
    (f := tmp_path / "real_1.csv").write_text("\n".join(lines) + "\n")
    assert detect_main(["evaluate", "--input", str(f), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["windows"] == 1 and doc["events"][0]["detected"] and doc["events"][0]["start_row"] == 999


def test_nab_windows_json_matched_on_the_path_tail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data" / "realKnownCause"
    data.mkdir(parents=True)
    lines = ["timestamp,value"]
    for i in range(N):
        minute = f"2014-07-{1 + i // 1440:02d} {i // 60 % 24:02d}:{i % 60:02d}:00"
        lines.append(f"{minute},{(160.0 if i in FAULT else 100.0) + (i % 3)}")
    (f := data / "nyc_taxi.csv").write_text("\n".join(lines) + "\n")
    other = data / "ec2_cpu.csv"
    other.write_text("timestamp,value\n2014-07-01 00:00:00,1\n")
    labels = tmp_path / "combined_windows.json"
    labels.write_text(json.dumps({
        "realKnownCause/nyc_taxi.csv": [["2014-07-01 15:00:00.000000", "2014-07-01 16:19:00.000000"]],
        "artificialWithAnomaly/nyc_taxi.csv": [],        # same file name elsewhere: the longer tail wins
        "realKnownCause/ec2_cpu.csv": []}))
    assert windows_for(f, read_windows_json(labels)) == [pytest.approx((1404226800.0, 1404231540.0))]
    assert detect_main(["evaluate", "--input", str(f), "--windows", str(labels), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["windows"] == 1 and doc["events"][0]["start_row"] == FAULT.start and doc["events"][0]["detected"]
    lonely = tmp_path / "elsewhere.csv"
    lonely.write_text("timestamp,value\n2014-07-01 00:00:00,1\n")
    assert detect_main(["evaluate", "--input", str(lonely), "--windows", str(labels)]) == 2
    assert "not listed in" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "expected"), [
    ("[1, 2]", "expected an object"),
    ('{"a.csv": [["2014-07-01", "2014-06-01"]]}', "before start"),
    ('{"a.csv": [["2014-07-01"]]}', "not a [start, end] pair"),
    ('{"a.csv": "x"}', "expected a list"),
    ('{"a.csv": [["yesterday", "today"]]}', "neither epoch seconds nor ISO-8601"),
    ('{"a.csv": [', "line 1: not JSON"),
])
def test_bad_nab_label_files_are_one_line_errors(tmp_path: Path, text: str, expected: str) -> None:
    (p := tmp_path / "labels.json").write_text(text)
    with pytest.raises(ReplayError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        read_windows_json(p)


def test_bad_files_name_line_and_column(tmp_path: Path) -> None:
    (p := tmp_path / "x.csv").write_text(SKAB_HEADER + "\n2020-03-09 10:00:00;1;2;x;4;5;6;7;8;0;0\n")
    with pytest.raises(ReplayError, match=r"line 2: column 'Current': .*'x'"):
        read_labelled(p)
    (p := tmp_path / "y.csv").write_text("when,value\n1,2\n")
    with pytest.raises(ReplayError, match="no timestamp column"):
        read_labelled(p)
    with pytest.raises(ReplayError, match="no column 'Pressure2'"):
        read_labelled(_skab(tmp_path / "0.csv"), ["Pressure2"])
    (p := tmp_path / "z.csv").write_text("timestamp;label\n1;0\n")
    with pytest.raises(ReplayError, match="no value column"):
        read_labelled(p)


@pytest.mark.parametrize("cell, label", [("0", 0), ("1", 1), ("0.0", 0), ("1.0", 1), ("true", 1), ("FALSE", 0),
                                         ("True", 1), ("", 0)])
def test_labels_in_every_corpus_spelling_are_read(tmp_path: Path, cell: str, label: int) -> None:
    (p := tmp_path / "l.csv").write_text(f"timestamp,value,anomaly\n1,5,0\n2,6,{cell}\n")
    assert read_labelled(p).labels == [0, label]


@pytest.mark.parametrize("cell", ["nan", "NaN", "yes", "no", "2", "-1", "0.5", "inf"])
def test_a_label_that_is_not_0_or_1_names_line_and_column(tmp_path: Path, cell: str) -> None:
    (p := tmp_path / "l.csv").write_text(f"timestamp,value,anomaly\n1,5,0\n2,6,{cell}\n")
    with pytest.raises(ReplayError, match=rf"^line 3: column 'anomaly': label '{cell}' is not 0 or 1$"):
        read_labelled(p)


def test_a_file_of_nan_labels_is_an_error_not_one_anomaly_window(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["timestamp,value,is_anomaly"] + [f"{i},{100.0 + i % 5},nan" for i in range(1, N + 1)]
    (f := tmp_path / "real_1.csv").write_text("\n".join(lines) + "\n")
    assert detect_main(["evaluate", "--input", str(f)]) == 2
    assert "line 2: column 'is_anomaly': label 'nan' is not 0 or 1" in capsys.readouterr().err


@pytest.mark.parametrize("times, count, line, shown", [
    ((3, 2, 1), 2, 3, "'2' is not after line 2's '3'"),                  # reversed
    ((1, 2, 2, 3), 1, 4, "'2' is not after line 3's '2'"),               # repeated
    ((1, 3, 2, 4), 1, 4, "'2' is not after line 3's '3'"),               # unsorted
])
def test_time_that_does_not_increase_is_kept_in_file_order_and_named(tmp_path: Path, times: tuple[int, ...],
                                                                     count: int, line: int, shown: str) -> None:
    # said, not refused: a local-time corpus repeats an hour at a DST change, and one such file
    # must not fail the whole corpus
    (p := tmp_path / "t.csv").write_text("timestamp,value,label\n" + "".join(f"{t},5,0\n" for t in times))
    got = read_labelled(p)
    assert got.timestamps == [float(t) for t in times]
    assert got.unordered == count and got.first_unordered.startswith(f"line {line}: timestamp {shown}")
    # SKAB's datetime column too, on the same check
    rows = [f"2020-03-09 10:00:{s:02d};1;2;3;4;5;6;7;8;0.0;0.0" for s in (0, 1, 1)]
    (q := tmp_path / "s.csv").write_text(SKAB_HEADER + "\n" + "\n".join(rows) + "\n")
    got = read_labelled(q)
    assert got.unordered == 1 and got.first_unordered.startswith(
        "line 4: timestamp '2020-03-09 10:00:01' is not after line 3's")
    assert read_labelled(_skab(tmp_path / "0.csv")).unordered == 0


def test_gaps_repeat_the_channel_and_leading_gaps_are_dropped(tmp_path: Path) -> None:
    (p := tmp_path / "g.csv").write_text("time;a;b;anomaly\n1;;5;0\n2;1;;0\n3;2;7;1\n4;;;0\n")
    got = read_labelled(p)
    assert got.timestamps == [2.0, 3.0] and got.channels == {"a": [1.0, 2.0], "b": [5.0, 7.0]}
    assert got.labels == [0, 1]


def test_a_file_torn_mid_write_is_read_up_to_the_tear_or_named(tmp_path: Path) -> None:
    whole = _skab(tmp_path / "0.csv").read_text()
    cut = whole[: len(whole) // 2 + 17]           # mid-row
    (p := tmp_path / "torn.csv").write_text(cut)
    with pytest.raises(ReplayError, match=r"line \d+: expected 11 columns"):
        read_labelled(p)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.text(alphabet=st.sampled_from(list("0123456789.,;\t-:eE naxT\n\"'")), max_size=300),
       header=st.sampled_from(["timestamp,value,label", SKAB_HEADER, "timestamp,value,is_anomaly", "time;a;b", ""]))
def test_fuzz_any_text_is_a_series_or_a_named_error(tmp_path: Path, header: str, body: str) -> None:
    (p := tmp_path / "f.csv").write_text(header + "\n" + body, encoding="utf-8")
    try:
        got = read_labelled(p)
    except ReplayError as e:
        assert str(e).startswith("line ")
        return
    n = len(got.timestamps)
    assert all(len(c) == n for c in got.channels.values()) and (got.labels is None or len(got.labels) == n)
    assert all(math.isfinite(v) for c in got.channels.values() for v in c)


def test_not_utf8_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (p := tmp_path / "latin.csv").write_bytes(b"timestamp,value,label\n1,2\xff,0\n")
    assert detect_main(["evaluate", "--input", str(p)]) == 2
    assert f"{p}: not UTF-8 text" in capsys.readouterr().err


def test_replay_scores_a_skab_file_per_channel_and_the_row_takes_the_max(tmp_path: Path) -> None:
    src = _skab(tmp_path / "0.csv", fault_channel=5)
    out = tmp_path / "scores.csv"
    assert detect_main(["replay", "--input", str(src), "--output", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].split(",") == ["timestamp", "score", *(f"score_{c}" for c in SKAB_HEADER.split(";")[1:9])]
    rows = [[float(x) for x in line.split(",")[1:]] for line in lines[1:]]
    assert len(rows) == N and all(r[0] == max(r[1:]) for r in rows)
    assert max(r[6] for r in rows[FAULT.start:FAULT.stop]) > 0.5          # the faulty channel (Thermocouple)
    assert max(r[3] for r in rows[FAULT.start:FAULT.stop]) < 0.5          # a quiet one (Current)
    one = tmp_path / "current.csv"
    assert detect_main(["replay", "--input", str(src), "--column", "Current", "--output", str(one)]) == 0
    first, second = one.read_text().splitlines()[:2]
    assert first == "timestamp,value,score" and second.split(",")[1] == "30.000000"


def test_replay_names_the_column_of_a_bad_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (p := tmp_path / "x.csv").write_text(SKAB_HEADER + "\n2020-03-09 10:00:00;1;2;x;4;5;6;7;8;0;0\n")
    assert detect_main(["replay", "--input", str(p)]) == 2
    assert "line 2: column 'Current': value 'x' is not a number" in capsys.readouterr().err
