"""`make bench` / `python -m bench`: every benchmark in bench/bench_*.py, one table, same-run baselines.

Each module exposes ``run(quick: bool) -> list[dict]`` (rows: benchmark, metric, value, baseline,
baseline_value, ratio, unit, target, ok). Figures are ratios against a baseline measured in the same run
(the machines are shared and noisy). The table is printed and saved as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import orjson

RESULTS = Path(__file__).resolve().parent / "results"

EPILOG = """examples:
  python -m bench                   # everything (several minutes)
  python -m bench --quick           # smaller sizes
  python -m bench --only stream,scheduler
"""


def modules() -> list[str]:
    here = Path(__file__).resolve().parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = [("benchmark", "benchmark"), ("metric", "metric"), ("value", "value"), ("unit", "unit"),
            ("baseline", "baseline (same run)"), ("baseline_value", "baseline value"), ("ratio", "ratio"),
            ("target", "target"), ("ok", "ok")]
    cells = [[fmt(r.get(k, "")) if k != "ok" else {True: "yes", False: "NO", None: "-"}.get(r.get("ok"), "-")
              for k, _ in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, (_, h) in enumerate(cols)]
    line = " | ".join(h.ljust(w) for (_, h), w in zip(cols, widths))
    print(line)
    print("-+-".join("-" * w for w in widths))
    for c in cells:
        print(" | ".join(x.ljust(w) for x, w in zip(c, widths)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", help="comma-separated module suffixes (e.g. stream,detect)")
    p.add_argument("--skab", metavar="DIR", help="SKAB data directory for bench_detect (or OPSLOOP_SKAB_DIR)")
    a = p.parse_args(argv)
    if a.skab:
        os.environ["OPSLOOP_SKAB_DIR"] = a.skab
    names = modules()
    if a.only:
        wanted = {f"bench_{x.strip()}" for x in a.only.split(",")}
        names = [n for n in names if n in wanted]
    rows: list[dict[str, Any]] = []
    failed = []
    for name in names:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            mod = importlib.import_module(f"bench.{name}")
            got = mod.run(quick=a.quick)
            rows.extend(got)
        except Exception as e:  # noqa: BLE001 - one broken benchmark must not hide the others
            failed.append(name)
            traceback.print_exc()
            rows.append({"benchmark": name, "metric": "FAILED", "value": f"{type(e).__name__}: {e}"[:60], "ok": False})
        print(f"[bench] {name} done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    print()
    print_table(rows)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_bytes(orjson.dumps({"host": platform.node(), "python": platform.python_version(), "quick": a.quick,
                                  "rows": rows}, option=orjson.OPT_INDENT_2, default=str))
    print(f"\nsaved {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
