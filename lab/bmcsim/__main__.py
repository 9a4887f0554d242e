"""Run a fleet of simulated BMCs in the foreground and write the collector's inventory for it.

The fleet follows "(Ceph) storage (server) power usage": generations 1/2/3 drawing 248/205/155 W, every fourth BMC without
DCMI (read by SDR). Stops all simulators (by PID) on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import yaml

from opsloop.lab.bmcsim.fleet import BMCFleet, BMCSpec

GENERATIONS = [("gen1", 248, 48), ("gen2", 205, 96), ("gen3", 155, 144)]  # name, watts, raw TB


def fleet_specs(count: int, dead: int) -> tuple[list[BMCSpec], dict[str, dict[str, object]]]:
    specs, metadata = [], {}
    for i in range(count):
        gen, watts, raw_tb = GENERATIONS[i % len(GENERATIONS)]
        name = f"stor-{gen}-{i:03d}"
        specs.append(BMCSpec(name, watts=watts, dcmi=(i % 4 != 3), dead=(i >= count - dead), poll_ms=1000))
        metadata[name] = {"generation": gen, "raw_capacity_tb": raw_tb, "disks": 12, "role": "ceph-osd"}
    return specs, metadata


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opsloop.lab.bmcsim", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python -m opsloop.lab.bmcsim --count 6 --inventory /tmp/bmcs.yaml\n"
               "  python -m opsloop.lab.bmcsim --count 200 --dead 20 --dir /tmp/fleet --inventory inv.yaml\n"
               "then point collectors.ipmi.inventory at the written file.",
    )
    parser.add_argument("--count", type=int, default=6, help="number of BMCs (default 6)")
    parser.add_argument("--dead", type=int, default=0, help="how many of them never answer (default 0)")
    parser.add_argument("--dir", type=Path, default=None, help="config/state directory (default: a temp dir)")
    parser.add_argument("--inventory", type=Path, required=True, help="where to write the inventory YAML")
    args = parser.parse_args(argv)
    if args.count < 1 or not 0 <= args.dead <= args.count:
        parser.error("--count must be >= 1 and --dead between 0 and --count")

    specs, metadata = fleet_specs(args.count, args.dead)
    root = args.dir or Path(tempfile.mkdtemp(prefix="bmcsim-"))
    root.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with BMCFleet(specs, root) as fleet:
        args.inventory.write_text(yaml.safe_dump(fleet.inventory(metadata), sort_keys=False))
        print(f"{len(fleet)} simulated BMCs up in {root}; inventory: {args.inventory}", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    print("simulated BMCs stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
