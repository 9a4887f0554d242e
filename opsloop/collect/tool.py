"""Run one tool with an explicit argv, a hard timeout, and no process left behind.

The child gets its own session (process group) so that on timeout the whole group is killed,
including anything it forked (``ip netns exec`` execs the tool; a wrapper such as ``sudo`` forks).
Output is decoded leniently: a parser downstream says what is wrong with it, never a decode error.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass

# Stable, untranslated tool messages: we match on "Permission denied" and friends.
_ENV = {**os.environ, "LC_ALL": "C", "LANG": "C"}


@dataclass(frozen=True, slots=True)
class ToolResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class ToolMissing(RuntimeError):
    """The executable does not exist (or is not executable)."""


class ToolTimeout(RuntimeError):
    """The tool ran past its deadline; it and its process group were killed."""


def run_tool(argv: list[str], timeout_s: float) -> ToolResult:
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env=_ENV)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
        raise ToolMissing(f"cannot run {argv[0]!r}: {e.strerror or e}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        reap(proc)
        raise ToolTimeout(f"{argv[0]} did not finish within {timeout_s:g}s and was killed") from None
    except BaseException:
        _kill_group(proc)
        reap(proc)
        raise
    return ToolResult(tuple(argv), proc.returncode,
                      out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


REAP_GRACE_S = 2.0  # after SIGKILL, how long the pipes may stay open before we stop reading them


def reap(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """Reap a killed tool; its stdout and stderr (what was read of them). A process that left its group
    (``setsid``: a helper a wrapper started, a daemonizing tool) survives the group kill holding our
    pipes: reading them to their end hung the round for as long as it lived, so after a grace period
    the pipes are closed instead."""
    try:
        out, err = proc.communicate(timeout=REAP_GRACE_S)
        return out or b"", err or b""
    except subprocess.TimeoutExpired as e:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()  # the leader itself was in the killed group
        return e.output or b"", e.stderr or b""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
