"""`opsloop detect evaluate` / `replay` on more public benchmarks' layouts as they come (Yahoo S5 A3/A4, the UCR
anomaly archive, TSB-UAD's header-less `value,label`, NAB label keys with other prefixes, epoch-ms exports) and
on hostile series. The files are written here in those layouts; no benchmark data is copied."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from opsloop.streams.detectors import evaluate_cli, replay_cli
from opsloop.streams.detectors.cli import main as detect_main
from opsloop.streams.detectors.evaluation import evaluate
from opsloop.streams.detectors.labelled_csv import read_labelled
from opsloop.streams.detectors.series_text import parse_timestamp

N = 800
SPIKE = range(500, 521)            # rows 500..520 counted from 1 (the UCR file name's convention)


def _wave(i: int) -> float:
    return math.sin(i / 10.0) * (3.0 if i in SPIKE else 1.0)


def _evaluate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    rc = detect_main(["evaluate", *args, "--json"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else {}), err


def _replay(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, list[str], str]:
    rc = detect_main(["replay", "--input", str(path)])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


def test_yahoo_a3_a4_components_are_not_channels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["timestamps,value,anomaly,changepoint,trend,noise,seasonality1,seasonality2,seasonality3"]
    for i in range(1, N + 1):
        t = 1416726000 + 3600 * i
        lines.append(f"{t},{_wave(i) + 5},{int(i in SPIKE)},{int(i == 300)},{i * 0.001},{0.01 * (i % 3)},"
                     f"{math.sin(i / 10.0)},0,0")
    (f := tmp_path / "A4Benchmark-TS1.csv").write_text("\n".join(lines) + "\n")
    got = read_labelled(f)
    assert list(got.channels) == ["value"] and got.labels is not None and sum(got.labels) == len(SPIKE)
    rc, doc, _ = _evaluate(capsys, "--input", str(f))
    assert rc == 0 and doc["windows"] == 1 and doc["events"][0]["start_row"] == SPIKE.start - 1


@pytest.mark.parametrize("one_line", [False, True])
def test_a_ucr_archive_file_takes_its_anomaly_from_its_name(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            one_line: bool) -> None:
    values = [f"{_wave(i):.7e}" for i in range(1, N + 1)]
    text = (" ".join(values) + "\n") if one_line else "".join(f"  {v}\n" for v in values)
    (f := tmp_path / f"001_UCR_Anomaly_DISTORTEDtest_300_{SPIKE.start}_{SPIKE.stop - 1}.txt").write_text(text)
    got = read_labelled(f)
    assert got.timestamps[:2] == [1.0, 2.0] and got.labels is not None and len(got.timestamps) == N
    assert got.labels.index(1) == SPIKE.start - 1 and sum(got.labels) == len(SPIKE)
    rc, doc, _ = _evaluate(capsys, "--input", str(f))
    assert rc == 0 and doc["windows"] == 1 and doc["events"][0]["detected"]
    rc, rows, _ = _replay(capsys, f)
    assert rc == 0 and rows[0] == "timestamp,value,score" and len(rows) == N + 1
    assert rows[SPIKE.start].startswith(f"{SPIKE.start},") and float(rows[SPIKE.start].split(",")[2]) > 0.5


def test_a_ucr_name_that_does_not_fit_the_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (f := tmp_path / "003_UCR_Anomaly_x_300_900_920.txt").write_text("".join(f"{_wave(i)}\n" for i in range(1, N)))
    rc, _, err = _evaluate(capsys, "--input", str(f))
    assert rc == 2 and "anomaly rows 900..920 do not fit its 799 rows" in err and len(err.splitlines()) == 1


def test_tsb_uad_value_label_and_other_header_less_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (f := tmp_path / "ECG_803.test.csv@1.out").write_text(
        "".join(f"{_wave(i)},{int(i in SPIKE)}\n" for i in range(1, N + 1)) + "\n")     # a trailing blank line
    got = read_labelled(f)
    assert got.labels is not None and got.labels.index(1) == SPIKE.start - 1 and len(got.timestamps) == N
    rc, doc, _ = _evaluate(capsys, "--input", str(f))
    assert rc == 0 and doc["windows"] == 1 and doc["events"][0]["detected"]
    rc, rows, _ = _replay(capsys, f)
    assert rc == 0 and len(rows) == N + 1 and rows[1].startswith("1,")
    # one value per line: labels come from --windows (row numbers)
    (single := tmp_path / "series.txt").write_text("".join(f"{_wave(i)}\n" for i in range(1, N + 1)))
    (w := tmp_path / "w.csv").write_text(f"start,end\n{SPIKE.start},{SPIKE.stop - 1}\n")
    rc, doc, _ = _evaluate(capsys, "--input", str(single), "--windows", str(w))
    assert rc == 0 and doc["events"][0]["start_row"] == SPIKE.start - 1
    # a header-less timestamp,value file would take its values for labels: refused, saying why
    (tv := tmp_path / "tv.csv").write_text("".join(f"{1700000000 + 60 * i},{_wave(i)}\n" for i in range(1, 50)))
    rc, _, err = _evaluate(capsys, "--input", str(tv))
    assert rc == 2 and "needs its header line" in err and len(err.splitlines()) == 1
    (three := tmp_path / "three.csv").write_text("1,2,0\n2,3,0\n")
    for rc, err in (_evaluate(capsys, "--input", str(three))[::2], _replay(capsys, three)[::2]):
        assert rc == 2 and "no header and 3 columns" in err and len(err.splitlines()) == 1


def _nab_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["timestamp,value"] + [f"2014-07-01 {i // 60:02d}:{i % 60:02d}:00,"
                                   f"{100.0 + (60 if 600 <= i < 620 else 0) + i % 3}" for i in range(N)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_nab_keys_with_other_prefixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _nab_file(tmp_path / "mine" / "realKnownCause" / "nyc_taxi.csv")
    win = [["2014-07-01 10:00:00.000000", "2014-07-01 10:30:00.000000"]]
    (labels := tmp_path / "windows.json").write_text(json.dumps({
        "C:\\NAB\\data\\realKnownCause\\nyc_taxi.csv": win,             # written on Windows
        "/srv/NAB/data/realKnownCause/ec2.csv": []}))
    rc, doc, _ = _evaluate(capsys, "--input", str(f), "--windows", str(labels))
    assert rc == 0 and doc["windows"] == 1 and doc["events"][0]["start_row"] == 600
    # a lone nyc_taxi.csv matches two keys as well: another file's windows must not be taken
    (labels2 := tmp_path / "two.json").write_text(json.dumps({"realKnownCause/nyc_taxi.csv": win,
                                                             "realTraffic/nyc_taxi.csv": []}))
    flat = _nab_file(tmp_path / "nyc_taxi.csv")
    rc, _, err = _evaluate(capsys, "--input", str(flat), "--windows", str(labels2))
    assert rc == 2 and "matches 2 keys" in err and len(err.splitlines()) == 1


def test_a_window_no_row_reaches_is_said_not_dropped_unsaid(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    f = _nab_file(tmp_path / "data" / "realKnownCause" / "nyc_taxi.csv")
    (labels := tmp_path / "windows.json").write_text(json.dumps({"realKnownCause/nyc_taxi.csv": [
        ["2014-07-01 10:00:00", "2014-07-01 10:30:00"], ["2014-07-02 10:00:00", "2014-07-02 10:30:00"]]}))
    rc, doc, err = _evaluate(capsys, "--input", str(f), "--windows", str(labels))
    assert rc == 0 and doc["windows"] == 1
    assert "window 2014-07-02 10:00:00..2014-07-02 10:30:00" in err and "holds no row" in err


def test_epoch_milliseconds_are_read_as_time_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_timestamp("1700000000000") == parse_timestamp("1700000000000000000") == 1.7e9
    assert parse_timestamp("1700000000") == 1.7e9 and parse_timestamp("42") == 42.0
    with pytest.raises(ValueError, match="beyond year 9999"):
        parse_timestamp("1e21")
    lines = ["Time,value,label"] + [f"{1700000000000 + 60000 * i},{_wave(i)},{int(i in SPIKE)}" for i in range(N)]
    (f := tmp_path / "grafana.csv").write_text("\n".join(lines) + "\n")
    got = read_labelled(f)
    assert got.timestamps[1] - got.timestamps[0] == 60.0
    rc, doc, _ = _evaluate(capsys, "--input", str(f), "--plot", str(tmp_path / "p.png"))
    assert rc == 0 and (tmp_path / "p.png").stat().st_size > 0 and doc["events"][0]["detected"]


def test_a_corpus_without_windows_counts_false_alarms_at_the_paging_score(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["timestamp,value,label"] + [f"{1700000000 + 60 * i},{math.sin(i / 10) + (30 if i == 450 else 0)},0"
                                        for i in range(600)]
    (f := tmp_path / "quiet.csv").write_text("\n".join(lines) + "\n")
    rc, doc, _ = _evaluate(capsys, "--input", str(f))
    assert rc == 0 and doc["windows"] == 0 and doc["profiles"][0]["score"] is None
    assert doc["threshold"] == evaluate_cli.PAGING_SCORE and doc["false_alarms"] == 1 and doc["precision"] == 0.0
    assert detect_main(["evaluate", "--input", str(f)]) == 0
    assert "no labelled window in the corpus" in capsys.readouterr().out


def test_long_runs_say_how_far_they_got(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluate_cli, "PROGRESS_POINTS", 200)
    monkeypatch.setattr(replay_cli, "PROGRESS_ROWS", 200)
    lines = ["timestamp,value,label"] + [f"{i},{_wave(i)},{int(i in SPIKE)}" for i in range(1, N + 1)]
    (f := tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    rc, _, err = _evaluate(capsys, "--input", str(f))
    assert rc == 0 and "s: 400 of 800 points scored" in err
    rc, _, err = _replay(capsys, f)
    assert rc == 0 and "400 rows scored" in err


def test_replay_skips_a_row_of_empty_cells_as_evaluate_does(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (f := tmp_path / "s.csv").write_text("timestamp,value,label\n1,1,0\n,,\n2,1,0\n")
    rc, rows, err = _replay(capsys, f)
    assert rc == 0 and rows == ["timestamp,value,score", "1,1,0.000000", "2,1,0.000000"], err


HOSTILE = {
    "constant": lambda i: ("5.0", i in SPIKE),
    "huge_alternating": lambda i: (f"{(-1) ** i * 1e49!r}", i in SPIKE),
    "nan_inf_and_empty_cells": lambda i: ("nan" if i % 7 == 0 else "" if i % 11 == 0 else f"{_wave(i)}", i in SPIKE),
    "all_labels_1": lambda i: (f"{_wave(i)}", True),
    "no_label_1": lambda i: (f"{_wave(i)}", False),
    "integers_past_2_53": lambda i: (str(2 ** 53 + 7 * (i % 5) + (10 ** 14 if i in SPIKE else 0)), i in SPIKE),
    "window_at_the_very_start": lambda i: (f"{_wave(i) + (9 if i < 10 else 0)}", i < 10),
    "window_at_the_very_end": lambda i: (f"{_wave(i) + (9 if i > N - 5 else 0)}", i > N - 5),
}
TIMES = {
    "regular": lambda i: 1700000000 + 60 * i,
    "backwards": lambda i: 1700000000 - 60 * i,
    "duplicates": lambda i: 1700000000 + 60 * (i // 3),
    "gaps_of_days": lambda i: 1700000000 + 300 * i + (i // 100) * 3 * 86400,
}


@pytest.mark.parametrize("times", sorted(TIMES))
@pytest.mark.parametrize("series", sorted(HOSTILE))
def test_hostile_series_score_or_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           series: str, times: str) -> None:
    lines = ["timestamp,value,label"]
    for i in range(1, N + 1):
        value, label = HOSTILE[series](i)
        lines.append(f"{TIMES[times](i)},{value},{int(label)}")
    (f := tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    rc, doc, err = _evaluate(capsys, "--input", str(f))
    assert rc == 0, err
    assert all(p["score"] is None or -1e6 < p["score"] <= 100.0 for p in doc["profiles"])
    assert 0.0 <= doc["precision"] <= 1.0 and 0.0 <= doc["recall"] <= 1.0
    if series == "window_at_the_very_end" and times == "regular":
        assert doc["profiles"][0]["score"] == 100.0           # found at its first row
    if series == "window_at_the_very_start":
        assert doc["events"][0]["detected"] is False           # inside the warm-up: missed, said, no crash
    rc, rows, err = _replay(capsys, f)
    assert rc == 0 and len(rows) == N + 1, err
    assert all(0.0 <= float(r.rsplit(",", 1)[1]) <= 1.0 for r in rows[1:])


@pytest.mark.parametrize(("text", "expected"), [
    ("1,1e300,0\n", "beyond ±1e+50"), ("1,-1e308,0\n2,1e308,0\n", "beyond ±1e+50"),
    ("1,inf,0\n", "not finite"), ("", "no rows with a value"),
])
def test_values_beyond_the_model_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     text: str, expected: str) -> None:
    (f := tmp_path / "s.csv").write_text("timestamp,value,label\n" + text)
    rc, _, err = _evaluate(capsys, "--input", str(f))
    assert rc == 2 and expected in err and len(err.splitlines()) == 1


def test_a_single_row_scores_without_a_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for label in (0, 1):
        (f := tmp_path / "s.csv").write_text(f"timestamp,value,label\n1,1.0,{label}\n")
        rc, doc, err = _evaluate(capsys, "--input", str(f))
        assert rc == 0 and doc["windows"] == label, err
        rc, rows, _ = _replay(capsys, f)
        assert rc == 0 and rows[1] == "1,1.0,0.000000"


class _CountedWindows(list):
    """Windows that count how often they are walked through."""
    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()


def test_false_alarms_are_counted_in_one_pass_over_the_windows() -> None:
    # alternating labels (or scattered point labels) make as many windows as alarms: each alarm compared
    # with every window was quadratic, 10^5 rows ran for an hour
    n = 4000
    scores = [1.0 if i % 4 == 1 else 0.0 for i in range(n)]          # an alarm every 4th row, none in a window
    windows = _CountedWindows((i, i) for i in range(0, n, 8))
    e = evaluate(scores, [float(i) for i in range(n)], windows, threshold=0.5)
    assert e.windows == n // 8 and e.detected == 0 and e.false_positives == n // 4
    assert _CountedWindows.walks <= 3
