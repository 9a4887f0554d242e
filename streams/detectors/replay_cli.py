"""``opsloop detect replay``: run the streaming detector over a CSV, one score per row.

Input: CSV with a header naming a ``timestamp`` and a ``value`` column (other columns are ignored;
``timestamps``/``values`` are accepted as names too). Timestamps are epoch seconds (int or float)
or ISO-8601 / ``YYYY-MM-DD HH:MM:SS`` (naive times are UTC). Output: CSV ``timestamp,value,score``
with the input's timestamp and value text unchanged, in input order; each score in [0, 1] comes
from exactly the streaming detector (``anomaly.StreamingDetector``) fed the rows up to and
including that row. An empty value scores 0 and does not feed the detector.

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
from datetime import datetime, timezone
from typing import Iterator, TextIO

from .anomaly.model import StreamingDetector

TIMESTAMP_NAMES = ("timestamp", "timestamps")
VALUE_NAMES = ("value", "values")

EPILOG = """\
examples:
  opsloop detect replay --input series.csv --output scores.csv
  opsloop detect replay < series.csv > scores.csv
  opsloop detect replay --input series.csv --skip-bad      # bad rows score 0, counted on stderr

input:  timestamp,value          output: timestamp,value,score
        2024-05-01 03:10:00,12.5         2024-05-01 03:10:00,12.5,0.000000
"""


class ReplayError(ValueError):
    """A bad input row or header; the message names the line and the offending text."""


def parse_timestamp(text: str) -> float:
    s = text.strip()
    if not s:
        raise ValueError("empty timestamp")
    try:
        t = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(t):
            raise ValueError(f"timestamp {s!r} is not finite")
        return t
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00") if s.endswith("Z") else s)
    except ValueError:
        raise ValueError(f"timestamp {s!r} is neither epoch seconds nor ISO-8601") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def parse_value(text: str) -> float | None:
    s = text.strip()
    if not s or s.lower() in ("nan", "null", "none", "na"):
        return None
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"value {s!r} is not a number") from None
    if math.isinf(v):
        raise ValueError(f"value {s!r} is not finite")
    return v


def _columns(header: list[str]) -> tuple[int, int]:
    names = [h.strip().lower() for h in header]
    t = next((names.index(n) for n in TIMESTAMP_NAMES if n in names), None)
    v = next((names.index(n) for n in VALUE_NAMES if n in names), None)
    if t is None or v is None:
        raise ReplayError(f"line 1: header {','.join(header)!r} must name a 'timestamp' and a 'value' column")
    return t, v


def replay(src: TextIO, dst: TextIO, skip_bad: bool = False) -> tuple[int, int]:
    """Score every row of `src` into `dst`. Returns (rows, skipped)."""
    reader = csv.reader(src)
    header = next(reader, None)
    if header is None:
        raise ReplayError("line 1: empty input, expected a 'timestamp,value' header")
    ti, vi = _columns(header)
    need = max(ti, vi)
    det = StreamingDetector()
    update = det.update
    out = csv.writer(dst, lineterminator="\n")
    out.writerow(["timestamp", "value", "score"])
    rows = skipped = 0
    for line_no, row in zip(_line_numbers(reader), reader):
        if not row:
            continue
        rows += 1
        try:
            if len(row) <= need:
                raise ValueError(f"expected at least {need + 1} columns, got {len(row)}: {','.join(row)!r}")
            ts_text, value_text = row[ti], row[vi]
            ts = parse_timestamp(ts_text)
            value = parse_value(value_text)
        except ValueError as e:
            if not skip_bad:
                raise ReplayError(f"line {line_no}: {e}") from None
            skipped += 1
            out.writerow([row[ti] if len(row) > ti else "", row[vi] if len(row) > vi else "", "0.000000"])
            continue
        score = 0.0 if value is None else update(ts, value)
        out.writerow([ts_text, value_text, f"{score:.6f}"])
    return rows, skipped


def _line_numbers(reader: "csv._reader") -> Iterator[int]:  # type: ignore[name-defined]
    while True:
        yield reader.line_num + 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opsloop detect replay", description=__doc__.split("\n\n")[0],
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", "-i", default="-", help="CSV with timestamp,value header ('-' = stdin, default)")
    p.add_argument("--output", "-o", default="-", help="CSV timestamp,value,score ('-' = stdout, default)")
    p.add_argument("--skip-bad", action="store_true", help="score bad rows 0 and go on (count on stderr)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    buffer = io.StringIO()   # whole output first: a bad row leaves no half-written file
    try:
        if args.input == "-":
            rows, skipped = replay(sys.stdin, buffer, skip_bad=args.skip_bad)
        else:
            with open(args.input, newline="", encoding="utf-8") as src:
                rows, skipped = replay(src, buffer, skip_bad=args.skip_bad)
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
    if skipped:
        print(f"replay: skipped {skipped} bad row(s) of {rows} (scored 0)", file=sys.stderr)
    return 0



if __name__ == "__main__":
    sys.exit(main())
