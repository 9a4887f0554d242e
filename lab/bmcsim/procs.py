"""Which processes of a given name this process has running now (for tests and the benchmark).

Reads /proc/<pid>/task/*/children (children of every thread: the collector forks from worker
threads), so a sample costs a few small reads instead of a walk over all of /proc.
"""

from __future__ import annotations

import glob
import os


def live_children(comm: str, parent: int | None = None) -> list[int]:
    """PIDs of ``parent``'s (default: this process's) children named ``comm``, zombies excluded."""
    parent = os.getpid() if parent is None else parent
    found = []
    for path in glob.glob(f"/proc/{parent}/task/*/children"):
        try:
            with open(path) as f:
                pids = f.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            state = stat[stat.rindex(")") + 2:].split()[0]
            if name == comm and state != "Z":
                found.append(int(pid))
    return found
