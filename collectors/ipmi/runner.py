"""Run one tool process with a hard deadline, and never leave it (or its children) behind.

Each process starts in its own session (so its own process group); on timeout, or if the caller
is interrupted, the whole group is killed with SIGKILL and reaped. Existing IPMI exporters are
known to pile up hundreds of stuck ipmitool processes when BMCs hang; this is the cure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from collections.abc import Mapping, Sequence

from opsloop.collect.tool import communicate_bounded, reap

MAX_OUTPUT_BYTES = 1024 * 1024  # an SDR dump is a few KiB; anything near this is garbage


@dataclass(frozen=True, slots=True)
class ToolResult:
    returncode: int | None  # None when killed on timeout
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    overflowed: bool = False  # printed more than MAX_OUTPUT_BYTES: killed there, the output cut


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # pgid == pid: start_new_session=True
    except ProcessLookupError:
        pass


def run_tool(argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None) -> ToolResult:
    """Run ``argv`` (no shell) and return its output; kill its process group after ``timeout_s``.

    Raises FileNotFoundError/PermissionError when the executable cannot be started.
    """
    started = time.monotonic()
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None, start_new_session=True, close_fds=True,
    )
    timed_out = overflowed = False
    try:
        out, err, overflowed = communicate_bounded(proc, max(timeout_s, 0.001), MAX_OUTPUT_BYTES)
        if overflowed:   # read no further: memory stays bounded whatever the tool prints
            _kill_group(proc)
            reap(proc)
    except subprocess.TimeoutExpired as e:
        timed_out = True
        _kill_group(proc)
        rest_out, rest_err = reap(proc)  # bounds the wait for pipes an orphan of the tool holds
        out, err = (e.output or b"") + rest_out, (e.stderr or b"") + rest_err
    except BaseException:
        _kill_group(proc)
        reap(proc)
        raise
    # No group kill after a clean exit: the leader is reaped, so its pid may already name an
    # unrelated process. A child that kept our pipes open makes communicate() time out while
    # the leader is still unreaped, and is then killed with the group above.
    return ToolResult(
        returncode=None if timed_out or overflowed else proc.returncode,
        stdout=out[:MAX_OUTPUT_BYTES].decode("utf-8", "replace"),
        stderr=err[:MAX_OUTPUT_BYTES].decode("utf-8", "replace"),
        timed_out=timed_out,
        seconds=time.monotonic() - started,
        overflowed=overflowed,
    )
