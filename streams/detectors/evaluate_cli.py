"""``opsloop detect evaluate``: backtest a detector configuration on labelled history.

Each input is a CSV with a timestamp column and a ``value`` column (or several channels, as SKAB's files)
and either a label column (``label``, ``anomaly``, ``is_anomaly``: non-zero inside an anomaly window) or
windows given by ``--windows``: a CSV of ``start,end`` timestamps (optionally a ``series`` column naming the
input file's stem) or NAB's ``combined_windows.json``. The layouts are those of
streams/detectors/labelled_csv.py (this project's, NAB's, Yahoo S5's incl. A3/A4, SKAB's, and header-less: the
UCR anomaly archive's ``.txt``, TSB-UAD's ``value,label``). A corpus without any labelled window has no window
score: its false alarms are counted at the stream's ``open_score``. The streaming detector (the
one ``opsloop detect replay`` runs) scores every row, one detector per channel, a row taking its highest
channel score; the result is

* the window score under the three cost profiles (one threshold for all inputs, the best of a sweep;
  0 = never alarming, 100 = perfect; see streams/detectors/evaluate_windows.py);
* at the standard profile's threshold (or ``--threshold``): per labelled window whether it was detected
  and the delay from its first row, and event precision / recall over all inputs;
* with ``--plot PNG``: the series, the detector's band, the score and the labelled windows.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from .anomaly.model import SAMPLE_NUMBERS_BELOW, DetectorConfig, StreamingDetector, checked_config
from .anomaly.settings import AnomalySettings
from .evaluate_windows import WindowScore, all_profiles, windows_from_labels
from .evaluation import evaluate
from .labelled_csv import read_labelled, read_windows_json, windows_for
from .series_text import ReplayError, parse_timestamp

# a corpus without any labelled window has no window score (never alarming and perfect are both 0):
# its false alarms are counted at the score that opens a finding in the stream, not at "never"
PAGING_SCORE: float = AnomalySettings.model_fields["open_score"].default
PROGRESS_POINTS = 250_000   # a 10^6-row file takes a minute: say how far it got

EPILOG = """\
examples:
  opsloop detect evaluate --input incidents/keystone.csv                  # label column in the file
  opsloop detect evaluate --input a.csv --input b.csv --windows windows.csv
  opsloop detect evaluate --input power.csv --set refractory=50 --set z0=3.5 --plot power.png
  opsloop detect evaluate --input power.csv --threshold 0.5 --json
  opsloop detect evaluate --input skab/data/valve1/*.csv                # SKAB: ';', every channel, max score
  opsloop detect evaluate --input skab/data/valve1/0.csv --column Current
  opsloop detect evaluate --input NAB/data/realKnownCause/*.csv --windows NAB/labels/combined_windows.json
  opsloop detect evaluate --input UCR_Anomaly_FullData/*.txt             # anomaly rows from each file name
  opsloop detect evaluate --input TSB-UAD-Public/YAHOO/*.out              # header-less value,label

windows.csv:  series,start,end                         (series = input file name without .csv; optional)
              power,2024-05-01 03:10:00,2024-05-01 03:40:00
windows.json: NAB's {"<dir>/<file>.csv": [["<start>", "<end>"], ...]}, matched on the input's path tail
"""


@dataclass
class Backtest:
    name: str
    timestamps: list[float]
    values: list[float]                 # the first channel (plotted)
    windows: list[tuple[int, int]]
    scores: list[float]
    expected: list[float]
    lower: list[float]
    upper: list[float]


def read_windows(path: Path) -> dict[str | None, list[tuple[float, float]]]:
    """Windows by series name (None = for every input) from a windows CSV."""
    out: dict[str | None, list[tuple[float, float]]] = {}
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"start", "end"} <= {h.strip().lower() for h in reader.fieldnames}:
            raise ReplayError(f"{path}: line 1: the windows file needs 'start' and 'end' columns")
        for line, row in enumerate(reader, start=2):
            row = {k.strip().lower(): (v or "") for k, v in row.items() if k}
            try:
                a, b = parse_timestamp(row["start"]), parse_timestamp(row["end"])
            except ValueError as e:
                raise ReplayError(f"{path}: line {line}: {e}") from None
            if b < a:
                raise ReplayError(f"{path}: line {line}: end {row['end']!r} is before start {row['start']!r}")
            out.setdefault(row.get("series") or None, []).append((a, b))
    return out


def rows_of(timestamps: Sequence[float], spans: Sequence[tuple[float, float]],
            missed: list[tuple[float, float]] | None = None) -> list[tuple[int, int]]:
    """The (first, last) rows of each span; a span holding no row is left out (and added to ``missed``)."""
    out = []
    for a, b in spans:
        idx = [i for i, t in enumerate(timestamps) if a <= t <= b]
        if idx:
            out.append((idx[0], idx[-1]))
        elif missed is not None:
            missed.append((a, b))
    return out


def series_name(path: Path, paths: Sequence[Path]) -> str:
    """The file's stem, with its folder when another input has the same stem (SKAB's valve1/0, valve2/0)."""
    same = sum(1 for p in paths if p.stem == path.stem)
    return path.stem if same == 1 else f"{path.parent.name}/{path.stem}"


def parse_overrides(pairs: Sequence[str]) -> DetectorConfig:
    types = {f.name: f.type for f in fields(DetectorConfig)}
    kw: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or key not in types:
            raise ValueError(f"--set {pair!r}: expected NAME=VALUE with NAME one of {', '.join(sorted(types))}")
        try:
            kw[key] = int(text) if types[key] in ("int", int) else float(text)
        except ValueError:
            raise ValueError(f"--set {pair!r}: {text!r} is not a number") from None
        try:
            checked_config({key: kw[key]}, "--set")   # z_width=0 divided by zero at every point
        except ValueError as e:
            raise ValueError(str(e)) from None
    return DetectorConfig(**kw)


def backtest(name: str, ts: list[float], channels: dict[str, list[float]], windows: list[tuple[int, int]],
             config: DetectorConfig, progress: Any = None) -> Backtest:
    """One detector per channel; a row's score is its highest channel score. The band shown is the first
    channel's. A line on ``progress`` every PROGRESS_POINTS points."""
    first = next(iter(channels.values()))
    bt = Backtest(name, ts, first, windows, [], [], [], [])
    total = len(ts) * len(channels)
    for k, values in enumerate(channels.values()):
        det = StreamingDetector(config)
        for i, (t, v) in enumerate(zip(ts, values)):
            if progress is not None and i and (k * len(ts) + i) % PROGRESS_POINTS == 0:
                print(f"evaluate: {name}: {k * len(ts) + i} of {total} points scored", file=progress, flush=True)
            score = det.update(t, v)
            if k:
                bt.scores[i] = max(bt.scores[i], score)
                continue
            bt.scores.append(score)
            e = det.explain()
            bt.expected.append(e["expected"])
            bt.lower.append(e["lower"] if e["warm"] else float("nan"))
            bt.upper.append(e["upper"] if e["warm"] else float("nan"))
    return bt


def report(tests: list[Backtest], threshold: float | None) -> tuple[list[WindowScore], dict[str, Any]]:
    profiles = all_profiles([(b.name, b.scores, b.windows) for b in tests])
    thr = threshold if threshold is not None else profiles[0].threshold
    if threshold is None and not profiles[0].windows:
        thr = PAGING_SCORE
    events = []
    detected = windows = fps = 0
    for b in tests:
        warm = int(0.15 * len(b.scores))
        e = evaluate(b.scores, b.timestamps, b.windows, thr if thr != float("inf") else 2.0, warm)
        windows += e.windows
        detected += e.detected
        fps += e.false_positives
        delays = iter(zip(e.delays_rows, e.delays_s))
        for a, z in b.windows:
            # as evaluate() counts it: warm-up rows raise no alarm (a window starting in them was a StopIteration)
            hit = any(b.scores[i] >= thr for i in range(max(a, warm), z + 1))
            rows, secs = next(delays) if hit else (None, None)
            events.append({"series": b.name, "start_row": a, "end_row": z, "start": b.timestamps[a],
                           "detected": hit, "delay_rows": rows, "delay_s": secs})
    summary = {"threshold": thr, "scored": bool(windows), "windows": windows, "detected": detected, "false_alarms": fps,
               "precision": detected / (detected + fps) if detected + fps else 1.0,
               "recall": detected / windows if windows else 1.0, "events": events}
    return profiles, summary


def print_table(profiles: list[WindowScore], summary: dict[str, Any], out: Any) -> None:
    print(f"{'profile':16s} {'score':>7s} {'threshold':>10s} {'detected':>9s} {'false-alarm rows':>17s}", file=out)
    for p in profiles:
        thr = "never" if p.threshold == float("inf") else f"{p.threshold:.4f}"
        score = f"{p.score:7.1f}" if p.windows else f"{'-':>7s}"
        print(f"{p.profile:16s} {score} {thr:>10s} {p.detected:>4d}/{p.windows:<4d} {p.false_alarm_rows:>17d}",
              file=out)
    if not summary["scored"]:
        print("no labelled window in the corpus: no window score; false alarms below are at the score that "
              "opens a finding (open_score)", file=out)
    thr = summary["threshold"]
    print(f"\nat threshold {thr:.4f}: precision {summary['precision']:.2f}, recall {summary['recall']:.2f}, "
          f"{summary['false_alarms']} false alarm(s)", file=out)
    print(f"{'series':30s} {'window start':>14s} {'detected':>9s} {'delay rows':>11s} {'delay s':>9s}", file=out)
    for e in summary["events"]:
        d = "yes" if e["detected"] else "MISSED"
        rows = "" if e["delay_rows"] is None else str(e["delay_rows"])
        secs = "" if e["delay_s"] is None else f"{e['delay_s']:.0f}"
        print(f"{e['series'][:30]:30s} {e['start_row']:>14d} {d:>9s} {rows:>11s} {secs:>9s}", file=out)


def _when(t: float) -> str:
    if abs(t) < SAMPLE_NUMBERS_BELOW:   # a sample number (Yahoo A1, a header-less file's row), as the detector reads it
        return f"{t:g}"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def plot(tests: list[Backtest], threshold: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = tests[:6]
    fig, axes = plt.subplots(2 * len(shown), 1, figsize=(12, 3.2 * len(shown)), sharex=False, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1] * len(shown)})
    for k, b in enumerate(shown):
        ax, sx = axes[2 * k][0], axes[2 * k + 1][0]
        x = [datetime.fromtimestamp(t, timezone.utc) for t in b.timestamps]
        ax.plot(x, b.values, lw=0.8, color="black", label="value")
        ax.fill_between(x, b.lower, b.upper, color="tab:blue", alpha=0.2, label="normal band")
        sx.plot(x, b.scores, lw=0.8, color="tab:red", label="score")
        if threshold != float("inf"):
            sx.axhline(threshold, ls="--", lw=0.8, color="grey", label=f"threshold {threshold:.2f}")
        for a, z in b.windows:
            for axis in (ax, sx):
                axis.axvspan(x[a], x[z], color="tab:orange", alpha=0.3, lw=0)
        ax.set_title(f"{b.name}  (orange: labelled windows)", fontsize=9)
        ax.legend(loc="upper left", fontsize=7)
        sx.set_ylim(-0.05, 1.05)
        sx.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsloop detect evaluate", description=__doc__.split("\n\n")[0],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", "-i", action="append", required=True, type=Path, nargs="+",
                   help="labelled CSV (timestamp,value[,label]; SKAB's, Yahoo S5's, NAB's, UCR's, TSB-UAD's "
                        "layout); several files, or the option repeated, make a corpus scored with one threshold")
    p.add_argument("--windows", type=Path,
                   help="anomaly windows instead of labels: a CSV start,end[,series] or NAB's combined_windows.json")
    p.add_argument("--column", action="append", default=[], metavar="NAME",
                   help="score only this channel of a multichannel file (repeatable; default: every channel)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="detector setting override, e.g. --set refractory=50 (see DetectorConfig)")
    p.add_argument("--threshold", type=float, help="threshold for the per-event table (default: the best one)")
    p.add_argument("--plot", type=Path, metavar="PNG", help="write a plot: series, band, score, windows")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = parse_overrides(args.set)
        spans: dict[str | None, list[tuple[float, float]]] = {}
        nab: dict[str, list[tuple[float, float]]] = {}
        if args.windows and args.windows.suffix.lower() == ".json":
            nab = read_windows_json(args.windows)
        elif args.windows:
            spans = read_windows(args.windows)
        paths = [p for group in args.input for p in group]
        files = []
        for path in paths:
            try:
                found = read_labelled(path, args.column)
            except ReplayError as e:
                raise ReplayError(f"{path}: {e}") from None
            if not found.timestamps:
                raise ReplayError(f"{path}: no rows with a value")
            if found.unordered:
                print(f"evaluate: {path}: {found.unordered} row(s) not after the row before, scored in "
                      f"file order; first: {found.first_unordered}", file=sys.stderr)
            files.append(found)
        # In a labelled corpus a file without a label column is normal operation (SKAB's anomaly-free file).
        any_labels = any(f.labels is not None for f in files)
        tests = []
        for path, found in zip(paths, files):
            ts = found.timestamps
            missed: list[tuple[float, float]] = []
            if args.windows and nab:
                try:
                    listed = windows_for(path, nab)
                except ReplayError as e:
                    raise ReplayError(f"{path}: {e}") from None
                if listed is None:
                    raise ReplayError(f"{path}: not listed in {args.windows}")
                windows = rows_of(ts, listed, missed)
            elif args.windows:
                # a window for every input may well miss one of them; one named for this file may not
                windows = rows_of(ts, spans.get(path.stem, []), missed) + rows_of(ts, spans.get(None, []))
            elif found.labels is not None:
                windows = windows_from_labels(found.labels)
            elif any_labels:
                print(f"evaluate: {path}: no label column: scored as anomaly-free", file=sys.stderr)
                windows = []
            else:
                raise ReplayError(f"{path}: no label column and no --windows file: nothing to score against")
            for a, b in missed:
                # a window the file's rows never reach (another time zone, another file's key) was dropped
                # unsaid, and the score was of fewer windows than labelled
                print(f"evaluate: {path}: window {_when(a)}..{_when(b)} of {args.windows} holds no row of the "
                      f"file (its rows run {_when(min(ts))}..{_when(max(ts))}): not scored", file=sys.stderr)
            tests.append(backtest(series_name(path, paths), ts, found.channels, windows, config, sys.stderr))
    except (ReplayError, ValueError) as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"evaluate: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    profiles, summary = report(tests, args.threshold)
    if args.json:
        doc = {"profiles": [{"profile": p.profile, "score": p.score if p.windows else None,
                             "threshold": p.threshold if p.threshold != float("inf") else None,
                             "detected": p.detected, "windows": p.windows, "false_alarm_rows": p.false_alarm_rows}
                            for p in profiles],
               **{k: (None if v == float("inf") else v) for k, v in summary.items()}}
        print(json.dumps(doc, indent=2))
    else:
        print_table(profiles, summary, sys.stdout)
    if args.plot:
        try:
            plot(tests, summary["threshold"], args.plot)
        except OSError as e:
            print(f"evaluate: cannot write {args.plot}: {e.strerror}", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
