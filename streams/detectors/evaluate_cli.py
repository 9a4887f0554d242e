"""``opsloop detect evaluate``: backtest a detector configuration on labelled history.

Each input is a CSV with ``timestamp`` and ``value`` columns and either a ``label`` column (1 inside an
anomaly window) or windows given by ``--windows`` (CSV ``start,end`` timestamps, optionally a ``series``
column naming the input file's stem). The streaming detector (the one ``opsloop detect replay`` runs) scores
every row; the result is

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
from pathlib import Path
from typing import Any, Sequence

from .anomaly.model import DetectorConfig, StreamingDetector
from .evaluate_windows import WindowScore, all_profiles, windows_from_labels
from .evaluation import evaluate
from .replay_cli import ReplayError, parse_timestamp, parse_value

EPILOG = """\
examples:
  opsloop detect evaluate --input incidents/keystone.csv                  # label column in the file
  opsloop detect evaluate --input a.csv --input b.csv --windows windows.csv
  opsloop detect evaluate --input power.csv --set refractory=50 --set z0=3.5 --plot power.png
  opsloop detect evaluate --input power.csv --threshold 0.5 --json

windows.csv:  series,start,end                         (series = input file name without .csv; optional)
              power,2024-05-01 03:10:00,2024-05-01 03:40:00
"""


@dataclass
class Backtest:
    name: str
    timestamps: list[float]
    values: list[float]
    windows: list[tuple[int, int]]
    scores: list[float]
    expected: list[float]
    lower: list[float]
    upper: list[float]


def read_series(path: Path) -> tuple[list[float], list[float], list[int] | None]:
    """timestamps, values and labels (None without a label column); rows with an empty value are dropped."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ReplayError("line 1: empty file, expected a 'timestamp,value[,label]' header")
        names = [h.strip().lower() for h in header]
        try:
            ti = next(names.index(n) for n in ("timestamp", "timestamps") if n in names)
            vi = next(names.index(n) for n in ("value", "values") if n in names)
        except StopIteration:
            raise ReplayError(f"line 1: header {','.join(header)!r} must name 'timestamp' and 'value'") from None
        li = names.index("label") if "label" in names else None
        ts: list[float] = []
        vs: list[float] = []
        labels: list[int] = []
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                if len(row) <= max(ti, vi, li or 0):
                    raise ValueError(f"expected {len(header)} columns, got {len(row)}")
                t = parse_timestamp(row[ti])
                v = parse_value(row[vi])
                lab = 0
                if li is not None:
                    text = row[li].strip()
                    lab = 1 if text and float(text) != 0.0 else 0
            except ValueError as e:
                raise ReplayError(f"line {line}: {e}") from None
            if v is None:
                continue
            ts.append(t)
            vs.append(v)
            labels.append(lab)
    return ts, vs, labels if li is not None else None


def read_windows(path: Path) -> dict[str | None, list[tuple[float, float]]]:
    """Windows by series name (None = for every input)."""
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


def rows_of(timestamps: Sequence[float], spans: Sequence[tuple[float, float]]) -> list[tuple[int, int]]:
    out = []
    for a, b in spans:
        idx = [i for i, t in enumerate(timestamps) if a <= t <= b]
        if idx:
            out.append((idx[0], idx[-1]))
    return out


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
    return DetectorConfig(**kw)


def backtest(name: str, ts: list[float], vs: list[float], windows: list[tuple[int, int]],
             config: DetectorConfig) -> Backtest:
    det = StreamingDetector(config)
    bt = Backtest(name, ts, vs, windows, [], [], [], [])
    for t, v in zip(ts, vs):
        bt.scores.append(det.update(t, v))
        e = det.explain()
        bt.expected.append(e["expected"])
        bt.lower.append(e["lower"] if e["warm"] else float("nan"))
        bt.upper.append(e["upper"] if e["warm"] else float("nan"))
    return bt


def report(tests: list[Backtest], threshold: float | None) -> tuple[list[WindowScore], dict[str, Any]]:
    profiles = all_profiles([(b.name, b.scores, b.windows) for b in tests])
    thr = threshold if threshold is not None else profiles[0].threshold
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
            hit = any(b.scores[i] >= thr for i in range(a, z + 1))
            rows, secs = next(delays) if hit else (None, None)
            events.append({"series": b.name, "start_row": a, "end_row": z, "start": b.timestamps[a],
                           "detected": hit, "delay_rows": rows, "delay_s": secs})
    summary = {"threshold": thr, "windows": windows, "detected": detected, "false_alarms": fps,
               "precision": detected / (detected + fps) if detected + fps else 1.0,
               "recall": detected / windows if windows else 1.0, "events": events}
    return profiles, summary


def print_table(profiles: list[WindowScore], summary: dict[str, Any], out: Any) -> None:
    print(f"{'profile':16s} {'score':>7s} {'threshold':>10s} {'detected':>9s} {'false-alarm rows':>17s}", file=out)
    for p in profiles:
        thr = "never" if p.threshold == float("inf") else f"{p.threshold:.4f}"
        print(f"{p.profile:16s} {p.score:7.1f} {thr:>10s} {p.detected:>4d}/{p.windows:<4d} {p.false_alarm_rows:>17d}",
              file=out)
    thr = summary["threshold"]
    print(f"\nat threshold {thr:.4f}: precision {summary['precision']:.2f}, recall {summary['recall']:.2f}, "
          f"{summary['false_alarms']} false alarm(s)", file=out)
    print(f"{'series':30s} {'window start':>14s} {'detected':>9s} {'delay rows':>11s} {'delay s':>9s}", file=out)
    for e in summary["events"]:
        d = "yes" if e["detected"] else "MISSED"
        rows = "" if e["delay_rows"] is None else str(e["delay_rows"])
        secs = "" if e["delay_s"] is None else f"{e['delay_s']:.0f}"
        print(f"{e['series'][:30]:30s} {e['start_row']:>14d} {d:>9s} {rows:>11s} {secs:>9s}", file=out)


def plot(tests: list[Backtest], threshold: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from datetime import datetime, timezone

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
    p.add_argument("--input", "-i", action="append", required=True, type=Path,
                   help="labelled CSV (timestamp,value[,label]); repeat for a corpus scored with one threshold")
    p.add_argument("--windows", type=Path, help="CSV of anomaly windows: start,end[,series] (instead of labels)")
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
        spans = read_windows(args.windows) if args.windows else {}
        tests = []
        for path in args.input:
            try:
                ts, vs, labels = read_series(path)
            except ReplayError as e:
                raise ReplayError(f"{path}: {e}") from None
            if spans:
                windows = rows_of(ts, spans.get(path.stem, []) + spans.get(None, []))
            elif labels is not None:
                windows = windows_from_labels(labels)
            else:
                raise ReplayError(f"{path}: no 'label' column and no --windows file: nothing to score against")
            tests.append(backtest(path.stem, ts, vs, windows, config))
    except (ReplayError, ValueError) as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"evaluate: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    profiles, summary = report(tests, args.threshold)
    if args.json:
        doc = {"profiles": [{"profile": p.profile, "score": p.score, "threshold": p.threshold if p.threshold !=
                             float("inf") else None, "detected": p.detected, "windows": p.windows,
                             "false_alarm_rows": p.false_alarm_rows} for p in profiles],
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
