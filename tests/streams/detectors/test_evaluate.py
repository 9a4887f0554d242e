"""Window scoring (the standard anomaly-benchmark scoring) and `opsloop detect evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsloop.streams.detectors.cli import main as detect_main
from opsloop.streams.detectors.evaluate_windows import (PROFILES, scaled_sigmoid, window_score, windows_around_events,
                                                windows_from_labels)

N = 1000
WINDOWS = [(400, 449), (700, 749)]


def _scores(rows: dict[int, float]) -> list[float]:
    s = [0.0] * N
    for i, v in rows.items():
        s[i] = v
    return s


def test_never_alarming_is_0_and_perfect_is_100() -> None:
    assert window_score([("a", [0.0] * N, WINDOWS)]).score == pytest.approx(0.0)
    perfect = window_score([("a", _scores({400: 1.0, 700: 1.0}), WINDOWS)])
    assert perfect.score == pytest.approx(100.0) and perfect.detected == 2 and perfect.false_alarm_rows == 0


def test_earlier_detection_earns_more_and_only_the_first_alarm_in_a_window_counts() -> None:
    early = window_score([("a", _scores({405: 1.0, 700: 1.0}), WINDOWS)]).score
    late = window_score([("a", _scores({445: 1.0, 700: 1.0}), WINDOWS)]).score
    assert 100.0 > early > late > 50.0
    many = window_score([("a", _scores({405: 1.0, 406: 1.0, 420: 1.0, 700: 1.0}), WINDOWS)]).score
    assert many == pytest.approx(early)


def test_false_alarms_cost_by_profile_and_the_sweep_picks_the_best_threshold() -> None:
    rows = {400: 0.9, 700: 0.9, 200: 0.5, 300: 0.5}            # two false alarms at a lower score
    r = window_score([("a", _scores(rows), WINDOWS)])
    assert r.threshold == 0.9 and r.score == pytest.approx(100.0)
    rows = {400: 0.5, 700: 0.9, 200: 0.6, 300: 0.6}            # catching the first window costs 2 FPs
    std, low_fp, low_fn = (window_score([("a", _scores(rows), WINDOWS)], p) for p in PROFILES)
    assert std.threshold == 0.5 and std.false_alarm_rows == 2
    assert std.score == pytest.approx(100 * (2 - 2 * 0.11 + 2) / 4)
    assert low_fp.score < std.score
    assert low_fn.threshold == 0.5


def test_probationary_rows_are_not_scored() -> None:
    r = window_score([("a", _scores({10: 1.0, 100: 1.0, 400: 1.0, 700: 1.0}), WINDOWS)])
    assert r.score == pytest.approx(100.0) and r.false_alarm_rows == 0


def test_window_conventions() -> None:
    assert windows_from_labels([0, 1, 1, 0, 0, 1]) == [(1, 2), (5, 5)]
    assert windows_around_events(1000, [500]) == [(450, 549)]
    assert windows_around_events(1000, [500, 900]) == [(475, 524), (875, 924)]
    assert scaled_sigmoid(-1.0) == pytest.approx(0.9866, abs=1e-4) and scaled_sigmoid(3.5) == -1.0


def _write(path: Path, values: list[float], labels: list[int] | None = None) -> Path:
    lines = ["timestamp,value" + (",label" if labels else "")]
    for i, v in enumerate(values):
        lines.append(f"{1_704_067_200 + 60 * i},{v}" + (f",{labels[i]}" if labels else ""))
    path.write_text("\n".join(lines) + "\n")
    return path


def _step_series() -> tuple[list[float], list[int]]:
    values = [100.0 + (i % 7) * 0.5 for i in range(1500)]
    labels = [0] * 1500
    for i in range(1000, 1060):
        values[i] += 40.0
        labels[i] = 1
    return values, labels


def test_evaluate_label_column_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values, labels = _step_series()
    src = _write(tmp_path / "power.csv", values, labels)
    png = tmp_path / "power.png"
    assert detect_main(["evaluate", "--input", str(src), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "standard" in out and "reward_low_fp" in out and "reward_low_fn" in out
    assert "power" in out and "MISSED" not in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_evaluate_windows_file_json_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values, _ = _step_series()
    src = _write(tmp_path / "power.csv", values)
    win = tmp_path / "windows.csv"
    win.write_text(f"series,start,end\npower,{1_704_067_200 + 60 * 1000},{1_704_067_200 + 60 * 1059}\n")
    assert detect_main(["evaluate", "--input", str(src), "--windows", str(win), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["profiles"][0]["score"] > 90 and doc["events"][0]["detected"] and doc["events"][0]["delay_rows"] == 0
    # A detector that cannot see the step (an absurd z0) scores 0: the setting is really applied.
    assert detect_main(["evaluate", "--input", str(src), "--windows", str(win), "--json",
                        "--set", "z0=1000", "--set", "long_z0=1000", "--set", "mean_z0=1000"]) == 0
    assert json.loads(capsys.readouterr().out)["profiles"][0]["score"] == pytest.approx(0.0)


def test_evaluate_bad_inputs_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values, _ = _step_series()
    plain = _write(tmp_path / "plain.csv", values)
    assert detect_main(["evaluate", "--input", str(plain)]) == 2
    assert "no label column" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,value,label\n1704067200,12,0\n1704067260,abc,0\n")
    assert detect_main(["evaluate", "--input", str(bad)]) == 2
    assert "line 3" in (err := capsys.readouterr().err) and "'abc'" in err
    assert detect_main(["evaluate", "--input", str(plain), "--set", "nope=1"]) == 2
    assert "nope" in capsys.readouterr().err
    assert detect_main(["evaluate", "--input", str(plain), "--set", "z_width=0"]) == 2   # divides by zero
    assert "z_width: 0.0 is out of range" in capsys.readouterr().err
    assert detect_main(["evaluate", "--input", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv" in capsys.readouterr().err


def test_detect_help_lists_evaluate(capsys: pytest.CaptureFixture[str]) -> None:
    assert detect_main(["--help"]) == 0
    assert "evaluate" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        detect_main(["evaluate", "--help"])
    assert "examples:" in capsys.readouterr().out


def test_a_window_inside_the_warm_up_rows_is_reported_missed_not_a_crash(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # A window starting in the first 15 % of rows, alarmed only there: the per-event table once counted the
    # alarm as a hit while the event scoring (which ignores warm-up rows) did not, and raised StopIteration.
    values, labels = _step_series()
    for i in range(200, 260):          # warm-up: the first 225 rows; the spike is in them, the window runs on
        values[i] += 400.0 if i < 210 else 0.0
        labels[i] = 1
    src = _write(tmp_path / "early.csv", values, labels)
    assert detect_main(["evaluate", "--input", str(src), "--json", "--threshold", "0.01"]) == 0
    events = json.loads(capsys.readouterr().out)["events"]
    assert [e["start_row"] for e in events] == [200, 1000]
    assert events[0]["detected"] is False and events[0]["delay_rows"] is None and events[1]["detected"]
