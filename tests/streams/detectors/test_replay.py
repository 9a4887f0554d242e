"""`opsloop detect replay` end to end (subprocess), and its parsers fuzzed."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from opsloop.streams.detectors.anomaly.model import score_series
from opsloop.streams.detectors.replay_cli import ReplayError, main, parse_timestamp, parse_value, replay
from tests.helpers import REPO

PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
SCENARIO = REPO / "tests" / "streams" / "detectors" / "scenarios" / "keystone_latency.csv"


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "opsloop.streams.detectors.replay_cli", *args], input=stdin,
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_replay_file_to_file_matches_the_streaming_detector(tmp_path: Path) -> None:
    out = tmp_path / "scores.csv"
    proc = _run(["--input", str(SCENARIO), "--output", str(out)])
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out.read_text())
    with open(SCENARIO) as f:
        src = list(csv.DictReader(f))
    assert len(rows) == len(src) and list(rows[0]) == ["timestamp", "value", "score"]
    assert [r["timestamp"] for r in rows] == [r["timestamp"] for r in src]
    expected = score_series([float(r["timestamp"]) for r in src], [float(r["value"]) for r in src])
    assert [float(r["score"]) for r in rows] == pytest.approx(expected, abs=1e-6)
    labeled = [float(r["score"]) for r, s in zip(rows, src) if s["label"] == "1"]
    assert max(labeled) >= 0.5


def test_replay_stdin_to_stdout_with_iso_timestamps() -> None:
    lines = ["timestamp,value"] + [f"2024-01-01 {h:02d}:{m:02d}:00,{10 + (m % 3)}" for h in range(6) for m in range(0, 60, 5)]
    lines.append("2024-01-01T06:00:00Z,500")
    proc = _run([], stdin="\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert len(rows) == len(lines) - 1
    assert all(0.0 <= float(r["score"]) <= 1.0 for r in rows)
    assert float(rows[-1]["score"]) > 0.9 and rows[-1]["timestamp"] == "2024-01-01T06:00:00Z"


def test_replay_bad_row_names_line_and_value() -> None:
    proc = _run(["-i", "-"], stdin="timestamp,value\n1700000000,1\n1700000060,abc\n")
    assert proc.returncode == 2
    assert "line 3" in proc.stderr and "'abc'" in proc.stderr and proc.stdout == ""


def test_a_value_beyond_the_detectors_range_is_a_bad_row() -> None:
    """1e200 is refused like 'abc' (named with its line; --skip-bad scores it 0 and goes on): fed to
    the detector it ended the replay with a traceback."""
    text = "timestamp,value\n1700000000,1\n1700000060,1e200\n1700000120,2\n"
    with pytest.raises(ReplayError, match=r"line 3: value '1e200': beyond ±1e\+50"):
        replay(io.StringIO(text), io.StringIO())
    out = io.StringIO()
    assert replay(io.StringIO(text), out, skip_bad=True)[:2] == (3, 1)
    assert [r["score"] for r in _rows(out.getvalue())][1] == "0.000000"


def test_replay_skip_bad_scores_zero_and_counts(tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_text("timestamp,value\n1700000000,1\nyesterday,2\n1700000120,\n1700000180,3\n")
    proc = _run(["--input", str(src), "--skip-bad"])
    assert proc.returncode == 0
    rows = _rows(proc.stdout)
    assert [r["score"] for r in rows[1:3]] == ["0.000000", "0.000000"]
    assert "skipped 1 bad row(s) of 4" in proc.stderr


def test_rows_out_of_time_order_are_scored_and_said(tmp_path: Path) -> None:
    """A file not sorted by time was scored without a word: the detector learns in input order."""
    src = tmp_path / "in.csv"
    src.write_text("timestamp,value\n1700000120,1\n1700000000,2\n1700000060,3\n1700000180,4\n")
    proc = _run(["--input", str(src)])
    assert proc.returncode == 0 and len(_rows(proc.stdout)) == 4
    assert "2 row(s) of 4 are stamped earlier than a row before them" in proc.stderr
    in_order = tmp_path / "sorted.csv"
    in_order.write_text("timestamp,value\n1700000000,2\n1700000060,3\n1700000060,3\n1700000180,4\n")
    assert "earlier" not in _run(["--input", str(in_order)]).stderr     # equal stamps are not backwards


def test_replay_header_and_missing_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("when,val\n1,2\n")
    assert main(["--input", str(bad)]) == 2
    assert "names no timestamp column" in capsys.readouterr().err
    assert main(["--input", str(tmp_path / "nope.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "examples:" in capsys.readouterr().out


def test_timestamp_formats() -> None:
    assert parse_timestamp("1700000000") == 1700000000.0
    assert parse_timestamp("1700000000.5") == 1700000000.5
    assert parse_timestamp("2023-11-14 22:13:20") == 1700000000.0
    assert parse_timestamp("2023-11-14T23:13:20+01:00") == 1700000000.0
    assert parse_timestamp("2023-11-14T22:13:20Z") == 1700000000.0
    with pytest.raises(ValueError, match="neither epoch"):
        parse_timestamp("14/11/2023")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_parsers_fuzzed_raise_only_value_error(text: str) -> None:
    for parse in (parse_timestamp, parse_value):
        try:
            parse(text)
        except ValueError as e:
            assert str(e)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.text(alphabet="0123456789.,-:eE xT\"", max_size=12), max_size=4), max_size=15))
def test_replay_fuzzed_rows_never_crash(rows: list[list[str]]) -> None:
    buf = io.StringIO()
    csv.writer(buf).writerows([["timestamp", "value"], *rows])
    out = io.StringIO()
    try:
        n = replay(io.StringIO(buf.getvalue()), out).rows
    except ReplayError as e:
        assert "line" in str(e)
        return
    scores = [float(r["score"]) for r in _rows(out.getvalue())]
    assert len(scores) == n and all(0.0 <= s <= 1.0 for s in scores)
