"""`python -m bench.bench_X [--quick]`: one benchmark alone, its rows printed (`python -m bench` prints the table)."""

from __future__ import annotations

import argparse
from typing import Any, Callable


def main(module: str, doc: str | None, run: Callable[..., list[dict[str, Any]]], argv: list[str] | None = None) -> int:
    name = module.rsplit(".", 1)[-1].removeprefix("bench_")
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"examples:\n  python -m {module} --quick\n  python -m bench --only {name}"
                                       "          # the same rows in the table, with the others")
    p.add_argument("--quick", action="store_true", help="the smaller sizes of `python -m bench --quick`")
    a = p.parse_args(argv)
    for row in run(quick=a.quick):
        print(row)
    return 0
