"""``opsloop detect replay``: run the streaming detector over a CSV, one score per row.

Input: CSV (``,``, ``;`` or tab, sniffed from the header) with a timestamp column (``timestamp``,
``datetime``, ``time``, ...) and a ``value`` column, or several value columns as SKAB's files (label
columns such as ``anomaly``/``is_anomaly`` and SKAB's ``changepoint`` are not values; ``--column``
picks some). Timestamps are epoch seconds (int or float; numbers past 1e11 are epoch ms, us or ns) or
ISO-8601 / ``YYYY-MM-DD HH:MM:SS`` (naive times are UTC). A header-less file (one value per line, a UCR
archive file, or TSB-UAD's ``value,label``) is read as streams/detectors/labelled_csv.py says: its
timestamp is the row number. Output, in input order: for one value column CSV ``timestamp,value,score`` with the
input's timestamp and value text unchanged; for several ``timestamp,score,score_<column>...``, one
detector per column, the row's score the highest. Each score in [0, 1] comes from exactly the
streaming detector (``anomaly.StreamingDetector``) fed the rows up to and including that row. An empty
value scores 0 and does not feed the detector.

A bad row (unparseable timestamp or value) stops the run with an error naming the line and the
text, exit status 2; with ``--skip-bad`` it scores 0 and the run goes on, and the count of skipped
rows is printed on stderr.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from typing import NamedTuple, Sequence, TextIO

from .anomaly.model import StreamingDetector
from .labelled_csv import data_lines, read_header, row_values
from .series_text import ReplayError, parse_timestamp, parse_value

__all__ = ["Counts", "ReplayError", "parse_timestamp", "parse_value", "replay", "main"]

PROGRESS_ROWS = 250_000     # a 10^6-row file takes tens of seconds: say how far it got

EPILOG = """\
examples:
  opsloop detect replay --input series.csv --output scores.csv
  opsloop detect replay < series.csv > scores.csv
  opsloop detect replay --input series.csv --skip-bad      # bad rows score 0, counted on stderr
  opsloop detect replay --input skab/data/valve1/0.csv     # ';' and eight channels: max score per row
  opsloop detect replay --input skab/data/valve1/0.csv --column Current

input:  timestamp,value          output: timestamp,value,score
        2024-05-01 03:10:00,12.5         2024-05-01 03:10:00,12.5,0.000000
"""


class Counts(NamedTuple):
    rows: int
    skipped: int
    backwards: int      # rows stamped earlier than a row before them (scored in input order all the same)


def replay(src: TextIO, dst: TextIO, skip_bad: bool = False, columns: Sequence[str] = (), name: str = "",
           progress: TextIO | None = None) -> Counts:
    """Score every row of `src` (named `name`: a UCR archive file's name holds its layout) into `dst`;
    a line on `progress` every PROGRESS_ROWS rows."""
    header_line, lines, first_line = data_lines(src.readline(), src, name)
    delim, header, ti, cols = read_header(header_line, columns)
    need = max([ti, *(i for i, _ in cols)])
    updates = [StreamingDetector().update for _ in cols]
    out = csv.writer(dst, lineterminator="\n")
    single = len(cols) == 1
    out.writerow(["timestamp", "value", "score"] if single
                 else ["timestamp", "score", *(f"score_{n}" for _, n in cols)])
    reader = csv.reader(lines, delimiter=delim)
    rows = skipped = backwards = 0
    newest = -math.inf
    for row in reader:
        if not row or not any(c.strip() for c in row):   # as evaluate: a row of empty cells is no row
            continue
        # a header-less file's time is its line number (UCR: value number); else the header is line 1
        line_no = int(row[0]) if first_line == 1 else reader.line_num + 1
        rows += 1
        if progress is not None and rows % PROGRESS_ROWS == 0:
            print(f"replay: {name}: {rows} rows scored", file=progress, flush=True)
        try:
            if len(row) <= need:
                raise ValueError(f"expected at least {need + 1} columns, got {len(row)}: {delim.join(row)!r}")
            ts = parse_timestamp(row[ti])
            values = row_values(row, cols, named=not single)
        except ValueError as e:
            if not skip_bad:
                raise ReplayError(f"line {line_no}: {e}") from None
            skipped += 1
            ts_text = row[ti] if len(row) > ti else ""
            if single:
                out.writerow([ts_text, row[cols[0][0]] if len(row) > cols[0][0] else "", "0.000000"])
            else:
                out.writerow([ts_text, "0.000000", *("0.000000" for _ in cols)])
            continue
        if ts < newest:
            backwards += 1
        newest = max(newest, ts)
        scores = [0.0 if v is None else update(ts, v) for update, v in zip(updates, values)]
        if single:
            out.writerow([row[ti], row[cols[0][0]], f"{scores[0]:.6f}"])
        else:
            out.writerow([row[ti], f"{max(scores):.6f}", *(f"{x:.6f}" for x in scores)])
    return Counts(rows, skipped, backwards)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opsloop detect replay", description=__doc__.split("\n\n")[0],
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", "-i", default="-", help="CSV with timestamp,value header ('-' = stdin, default)")
    p.add_argument("--output", "-o", default="-", help="CSV timestamp,value,score ('-' = stdout, default)")
    p.add_argument("--skip-bad", action="store_true", help="score bad rows 0 and go on (count on stderr)")
    p.add_argument("--column", action="append", default=[], metavar="NAME",
                   help="score only this value column of a multi-column file (repeatable; default: every one)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    buffer = io.StringIO()   # whole output first: a bad row leaves no half-written file
    try:
        if args.input == "-":
            counts = replay(sys.stdin, buffer, skip_bad=args.skip_bad, columns=args.column, name="-",
                            progress=sys.stderr)
        else:
            with open(args.input, newline="", encoding="utf-8") as src:
                counts = replay(src, buffer, skip_bad=args.skip_bad, columns=args.column, name=args.input,
                                progress=sys.stderr)
    except OSError as e:
        print(f"replay: cannot read {args.input}: {e.strerror}", file=sys.stderr)
        return 2
    except ReplayError as e:
        print(f"replay: {args.input}: {e}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as e:
        print(f"replay: {args.input}: not UTF-8 text ({e.reason} at byte {e.start})", file=sys.stderr)
        return 2
    except csv.Error as e:
        print(f"replay: {args.input}: malformed CSV: {e}", file=sys.stderr)
        return 2
    try:
        if args.output == "-":
            sys.stdout.write(buffer.getvalue())
            sys.stdout.flush()
        else:
            with open(args.output, "w", newline="", encoding="utf-8") as f:
                f.write(buffer.getvalue())
    except OSError as e:
        print(f"replay: cannot write {args.output}: {e.strerror}", file=sys.stderr)
        return 2
    if counts.skipped:
        print(f"replay: skipped {counts.skipped} bad row(s) of {counts.rows} (scored 0)", file=sys.stderr)
    if counts.backwards:
        # the detector learns in input order; its daily buckets and step sizes assume time moves forward
        print(f"replay: {counts.backwards} row(s) of {counts.rows} are stamped earlier than a row before them: "
              "the scores assume time order (sort the file by timestamp)", file=sys.stderr)
    return 0



if __name__ == "__main__":
    sys.exit(main())
