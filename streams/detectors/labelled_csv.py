"""Labelled series files in the layouts public anomaly benchmarks use, read one way.

* ``timestamp,value[,label]`` — this project's own layout and NAB's data files (NAB keeps its labels in
  a separate ``combined_windows.json``: see :func:`read_windows_json`);
* Yahoo S5's ``timestamp,value,is_anomaly`` (integer timestamps are epoch seconds here: only their order
  and spacing matter to the detector);
* SKAB's ``;``-separated ``datetime;<channel>...;anomaly;changepoint``: every numeric column other than
  the timestamp, the label and ``changepoint`` is a channel.

Files without a header line (the first line all numbers) take their row number (from 1) as the time:

* the UCR / KDD-Cup 2021 anomaly archive's ``NNN_UCR_Anomaly_<name>_<trainEnd>_<begin>_<end>.txt``: one
  value per line (or several, space-separated), the anomaly rows ``begin``..``end`` (counted from 1) from
  the file name; the training rows before ``trainEnd`` are scored as the rest (anomaly-free by the archive's
  construction, an alarm in them is a false alarm);
* TSB-UAD's ``value,label`` (its ``.out`` files), and one value per line (labels from ``--windows``).

Any other header-less file is refused (a header-less ``timestamp,value`` file would read its values as
labels). Yahoo S5 A3/A4's ``timestamps,value,anomaly,changepoint,trend,noise,seasonality1...`` is the one
channel ``value``: its other columns are the generator's components, not channels.

The delimiter is sniffed from the header (``,``, ``;`` or tab). A file with a ``value`` column has that
one channel; otherwise every remaining column is one (``columns`` picks some). A multichannel file is
scored channel by channel and each row takes the highest score (a fault shows in some channels only).
Rows whose channels are all empty are dropped, and so are rows before every channel has had a value; an
empty cell after that repeats the channel's previous value (a detector needs a value per row, and a gap is
not evidence of anything).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator, Sequence

from .series_text import ReplayError, parse_timestamp, parse_value

TIMESTAMP_COLUMNS = ("timestamp", "timestamps", "datetime", "time", "date")
LABEL_COLUMNS = ("label", "anomaly", "is_anomaly", "labels")
IGNORED_COLUMNS = ("changepoint",)   # SKAB's start/end markers: the anomaly column already holds the window
DELIMITERS = ",;\t"
UCR_NAME = re.compile(r"\d+_UCR_Anomaly_.+_(\d+)_(\d+)_(\d+)")   # stem: ..._<trainEnd>_<begin>_<end>
HEADERLESS = "header-less file (row numbers as time)"


@dataclass
class LabelledFile:
    timestamps: list[float]
    channels: dict[str, list[float]]     # column name -> values, in the file's column order
    labels: list[int] | None             # None: the file has no label column
    # rows whose time is not after the row before (kept, in file order), and the first of them: a
    # local-time series repeats an hour at a DST change; scored as read, but said
    unordered: int = 0
    first_unordered: str = ""


def read_labelled(path: Path, columns: Sequence[str] = ()) -> LabelledFile:
    """Read one file; ReplayError naming the line (and column) for anything that is not a labelled series."""
    try:
        return _read(path, columns)
    except UnicodeDecodeError as e:
        raise ReplayError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise ReplayError(f"malformed CSV: {e}") from None


def sniff_delimiter(header_line: str) -> str:
    """``,``, ``;`` or tab: the one the header line holds most of (``,`` when it holds none)."""
    counts = {d: header_line.count(d) for d in DELIMITERS}
    best = max(counts, key=lambda d: counts[d])
    return best if counts[best] else ","


def read_header(first: str, columns: Sequence[str] = ()) -> tuple[str, list[str], int, list[tuple[int, str]]]:
    """(delimiter, header, timestamp column, value columns) of a file's first line."""
    if not first.strip():
        raise ReplayError("line 1: empty file, expected a 'timestamp,value[,label]' header")
    delim = sniff_delimiter(first)
    header = next(csv.reader([first], delimiter=delim))
    ti, value_cols = value_columns(header, columns)
    return delim, header, ti, value_cols


def row_values(row: Sequence[str], value_cols: Sequence[tuple[int, str]], named: bool = True) -> list[float | None]:
    """The values of a row's value columns; a bad one a ValueError naming its column (``named``)."""
    vals = []
    for ci, name in value_cols:
        try:
            vals.append(parse_value(row[ci]))
        except ValueError as e:
            raise ValueError(f"column {name!r}: {e}" if named else e) from None
    return vals


# SKAB writes 0.0/1.0, Yahoo S5 0/1; anything else ('nan', 'yes', '2') is not a label we can score against.
_LABEL = re.compile(r"[01](?:\.0*)?")


def parse_label(cell: str, column: str) -> int:
    """0 or 1 from a label cell: 0/1, 0.0/1.0, true/false (any case); empty is 0. Else ValueError
    naming the column (a 'nan' label used to count as an anomaly)."""
    text = cell.strip()
    if not text or text.lower() == "false":
        return 0
    if text.lower() == "true":
        return 1
    if _LABEL.fullmatch(text):
        return int(text[0])
    raise ValueError(f"column {column!r}: label {text[:40]!r} is not 0 or 1")


def _numeric(cells: Sequence[str]) -> bool:
    try:
        return bool(cells) and all(math.isfinite(float(c)) or c.strip().lower() == "nan" for c in cells)
    except ValueError:
        return False


def ucr_anomaly(name: str) -> tuple[int, int, int] | None:
    """(trainEnd, begin, end) of a UCR anomaly archive file name, None for any other name."""
    m = UCR_NAME.fullmatch(PurePosixPath(name).stem)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def data_lines(first: str, rest: Iterable[str], name: str) -> tuple[str, Iterable[str], int]:
    """(header line, data lines, line number of the first data line) of a file whose first line is ``first``.
    A header-less file (:data:`HEADERLESS`) gets a ``timestamp,value[,label]`` header and its row number
    (from 1) as the timestamp of each row; a UCR archive file its label from the file name."""
    cells = next(csv.reader([first], delimiter=sniff_delimiter(first))) if first.strip() else []
    ucr = ucr_anomaly(name)
    if ucr and _numeric(first.split()):
        _, begin, end = ucr
        return "timestamp,value,label", _ucr_rows([first], rest, begin, end), 1
    if not _numeric(cells):
        return first, rest, 2
    if len(cells) > 2:
        raise ReplayError(f"line 1: no header and {len(cells)} columns: a {HEADERLESS} is one value per line "
                          "(UCR) or value,label (TSB-UAD); give any other a header line (timestamp,value,...)")
    delim = sniff_delimiter(first)
    header = "timestamp,value" if len(cells) == 1 else "timestamp,value,label"
    return header.replace(",", delim), _numbered([first], rest, delim), 1


def _numbered(first: Iterable[str], rest: Iterable[str], delim: str) -> Iterator[str]:
    for k, line in enumerate(itertools.chain(first, rest), start=1):
        if line.strip():     # a blank line (a trailing one) is no row, as in a file with a header
            yield f"{k}{delim}{line}"


def _ucr_rows(first: Iterable[str], rest: Iterable[str], begin: int, end: int) -> Iterator[str]:
    # one value a line as a rule, a few archive files hold them all on one line, space-separated
    k = 0
    for line in itertools.chain(first, rest):
        for tok in line.split():
            k += 1
            yield f"{k},{tok},{1 if begin <= k <= end else 0}\n"


def _read(path: Path, columns: Sequence[str]) -> LabelledFile:
    with path.open(newline="", encoding="utf-8") as f:
        header_line, lines, first_line = data_lines(f.readline(), f, path.name)
        delim, header, ti, value_cols = read_header(header_line, columns)
        names = [h.strip().lower() for h in header]
        li = next((names.index(n) for n in LABEL_COLUMNS if n in names), None)
        ts: list[float] = []
        chans: list[list[float]] = [[] for _ in value_cols]
        labels: list[int] = []
        last: list[float | None] = [None] * len(value_cols)
        prev: tuple[int, float, str] | None = None    # (line, time, text) of the last row read
        unordered, first_unordered = 0, ""
        reader = csv.reader(lines, delimiter=delim)
        for row in reader:
            if not row or not any(c.strip() for c in row):
                continue
            # a header-less file's time is its line number (UCR: value number)
            line = int(row[0]) if first_line == 1 else reader.line_num + 1
            try:
                if len(row) < len(header):
                    raise ValueError(f"expected {len(header)} columns, got {len(row)}")
                t = parse_timestamp(row[ti])
                # unsorted or repeated time blurs the sampling step the detector learns: said, not
                # refused (a whole corpus must not fail on one file's DST hour)
                if prev is not None and t <= prev[1]:
                    unordered += 1
                    first_unordered = first_unordered or (
                        f"line {line}: timestamp {row[ti].strip()[:40]!r} is not after line "
                        f"{prev[0]}'s {prev[2][:40]!r}")
                prev = (line, t, row[ti].strip())
                vals = row_values(row, value_cols)
                lab = 0 if li is None else parse_label(row[li], header[li].strip())
            except ValueError as e:
                how = (f" (read as a {HEADERLESS} of value,label, TSB-UAD's; a timestamp,value file needs its "
                       "header line)") if first_line == 1 and li is not None else ""
                raise ReplayError(f"line {line}: {e}{how}") from None
            if all(v is None for v in vals):
                continue
            last = [v if v is not None else last[k] for k, v in enumerate(vals)]
            if any(v is None for v in last):      # a channel with no value yet: nothing to score it on
                continue
            for k, v in enumerate(last):
                chans[k].append(v)  # type: ignore[arg-type]   # checked just above
            ts.append(t)
            labels.append(lab)
    ucr = ucr_anomaly(path.name) if first_line == 1 else None
    rows = int(ts[-1]) if ts else 0
    if ucr and not ucr[0] <= ucr[1] <= ucr[2] <= rows:
        raise ReplayError(f"the UCR file name's training end {ucr[0]} and anomaly rows {ucr[1]}..{ucr[2]} do not "
                          f"fit its {rows} rows")
    return LabelledFile(ts, {name: c for (_, name), c in zip(value_cols, chans)},
                        labels if li is not None else None, unordered, first_unordered)


def value_columns(header: list[str], wanted: Sequence[str] = ()) -> tuple[int, list[tuple[int, str]]]:
    """The timestamp column and the value columns (index, name) of a header: ``wanted`` ones, else
    ``value``, else every column that is not the timestamp, a label or ``changepoint``."""
    names = [h.strip().lower() for h in header]
    ti = next((names.index(n) for n in TIMESTAMP_COLUMNS if n in names), None)
    if ti is None:
        raise ReplayError(f"line 1: header {','.join(header)!r} names no timestamp column "
                          f"(one of {', '.join(TIMESTAMP_COLUMNS)})")
    if wanted:
        out = []
        for w in wanted:
            if w.strip().lower() not in names:
                raise ReplayError(f"line 1: no column {w!r} (columns: {', '.join(h.strip() for h in header)})")
            i = names.index(w.strip().lower())
            out.append((i, header[i].strip()))
        return ti, out
    for n in ("value", "values"):
        if n in names:
            return ti, [(names.index(n), header[names.index(n)].strip())]
    skip = {ti} | {names.index(n) for n in (*LABEL_COLUMNS, *IGNORED_COLUMNS) if n in names}
    out = [(i, h.strip()) for i, h in enumerate(header) if i not in skip and h.strip()]
    if not out:
        raise ReplayError(f"line 1: header {','.join(header)!r} has no value column besides the timestamp and label")
    return ti, out


def read_windows_json(path: Path) -> dict[str, list[tuple[float, float]]]:
    """NAB's label file (``combined_windows.json``): ``{"<dir>/<file>.csv": [[start, end], ...]}``."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ReplayError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ReplayError(f"{path}: line {e.lineno}: not JSON ({e.msg})") from None
    if not isinstance(doc, dict):
        raise ReplayError(f"{path}: expected an object mapping a data file to its windows")
    out: dict[str, list[tuple[float, float]]] = {}
    for key, spans in doc.items():
        if not isinstance(spans, list):
            raise ReplayError(f"{path}: {key!r}: expected a list of [start, end] pairs")
        got = []
        for span in spans:
            if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, (str, int, float)) for x in span)):
                raise ReplayError(f"{path}: {key!r}: {span!r} is not a [start, end] pair")
            try:
                a, b = parse_timestamp(str(span[0])), parse_timestamp(str(span[1]))
            except ValueError as e:
                raise ReplayError(f"{path}: {key!r}: {e}") from None
            if b < a:
                raise ReplayError(f"{path}: {key!r}: end {span[1]!r} is before start {span[0]!r}")
            got.append((a, b))
        out[key] = got
    return out


def windows_for(path: Path, by_key: dict[str, list[tuple[float, float]]]) -> list[tuple[float, float]] | None:
    """The windows of a data file in a NAB label map: the key with the longest common path tail wins
    (``realKnownCause/nyc_taxi.csv`` for ``data/realKnownCause/nyc_taxi.csv``, whatever prefix either has;
    ``\\`` in a key is a folder separator); None when no key names it. Several keys as long a match
    (``a/x.csv`` and ``b/x.csv`` for a lone ``x.csv``) is a ReplayError: another file's windows were taken."""
    parts = PurePosixPath(path.as_posix()).parts
    best, best_len, tied = None, 0, []
    for key, spans in by_key.items():
        kp = PurePosixPath(key.replace("\\", "/")).parts
        n = 0
        while n < min(len(kp), len(parts)) and kp[-1 - n] == parts[-1 - n]:
            n += 1
        if n > best_len:
            best, best_len, tied = spans, n, [key]
        elif n and n == best_len:
            tied.append(key)
    if len(tied) > 1:
        raise ReplayError(f"matches {len(tied)} keys of the windows file as well: {', '.join(tied[:3])} "
                          "(give the file's folder as the key has it)")
    return best
