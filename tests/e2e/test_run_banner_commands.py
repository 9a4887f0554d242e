"""The commands `opsloop run` prints once everything is up (and the README repeats) work pasted as they are,
in a shell without the venv on its PATH (a new user's): the banner printed a bare ``opsloop ...``, which
was "command not found" there."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from opsloop.config import Settings
from opsloop.lab.pipeline import LabPorts, banner
from opsloop.stack import Stack


def printed_commands(run_dir: Path) -> list[list[str]]:
    s = Settings()
    text = banner(Stack(s.stack), s, run_dir, LabPorts())
    out = []
    for line in text.splitlines():
        words = line.split()   # the paths have no spaces (tmp_path); other lines have apostrophes
        starts = [i for i, w in enumerate(words) if w == "opsloop" or w.endswith("/opsloop")]
        if starts and "--config" in words:
            out.append(words[starts[0]:])
    return out


def test_every_printed_command_runs_without_the_venv_on_path(tmp_path: Path) -> None:
    commands = printed_commands(tmp_path / "run")
    assert [c[1:3] for c in commands] == [["weights", "show"], ["weights", "history"], ["deadletter", "summary"]]
    venv_bin = str(Path(commands[0][0]).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    for argv in commands:
        assert argv[argv.index("--config") + 1] == str(tmp_path / "run" / "opsloop.yaml")
        r = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           env={**os.environ, "PATH": path or "/usr/bin:/bin"})
        assert r.returncode == 0 and r.stdout.startswith(f"usage: opsloop {argv[1]} {argv[2]}"), \
            f"{shlex.join(argv)}: exit {r.returncode}\n{r.stderr[-2000:]}"
