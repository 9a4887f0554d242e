"""Run one tool with an explicit argv, a hard timeout, and no process left behind.

The child gets its own session (process group) so that on timeout the whole group is killed,
including anything it forked (``ip netns exec`` execs the tool; a wrapper such as ``sudo`` forks).
Output is decoded leniently: a parser downstream says what is wrong with it, never a decode error.
Output is bounded: a tool printing without end (a wrapper in a loop, a broken build) is killed once its
stdout or stderr passes ``MAX_OUTPUT_BYTES``, instead of filling the collector's memory until the timeout.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

# Stable, untranslated tool messages: we match on "Permission denied" and friends.
_ENV = {**os.environ, "LC_ALL": "C", "LANG": "C"}
# far above any real listing (iptables-save of 100k rules is ~15 MB), far below a machine's memory
MAX_OUTPUT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ToolResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class ToolMissing(RuntimeError):
    """The executable cannot be started: it does not exist, or (:class:`ToolNotExecutable`) it cannot be run."""


class ToolNotExecutable(ToolMissing):
    """The executable exists but cannot be run (its mode, a noexec mount, an exec format error, no process
    slot): not an absent tool. A ToolMissing still for callers that only report it."""


class ToolTimeout(RuntimeError):
    """The tool ran past its deadline; it and its process group were killed."""


class ToolOutputTooLarge(RuntimeError):
    """The tool printed more than the bound; it and its process group were killed."""


def run_tool(argv: list[str], timeout_s: float) -> ToolResult:
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env=_ENV)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise ToolMissing(f"cannot run {argv[0]!r}: {e.strerror or e}") from None
    except PermissionError as e:   # EACCES: it is there; "missing" would let a caller skip it as not installed
        raise ToolNotExecutable(f"cannot run {_located(argv[0])}: not executable (its file mode, a directory's, "
                                f"or a noexec mount): {e.strerror or e}") from None
    except OSError as e:   # ENOEXEC (a script without #!), EAGAIN ...: raised on, it ended the whole round
        raise ToolNotExecutable(f"cannot run {_located(argv[0])}: {e.strerror or e}") from None
    try:
        out, err, overflow = communicate_bounded(proc, timeout_s, MAX_OUTPUT_BYTES)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        reap(proc)
        raise ToolTimeout(f"{argv[0]} did not finish within {timeout_s:g}s and was killed") from None
    except BaseException:
        _kill_group(proc)
        reap(proc)
        raise
    if overflow:
        _kill_group(proc)
        reap(proc)
        raise ToolOutputTooLarge(f"{argv[0]} printed more than {MAX_OUTPUT_BYTES} bytes and was killed: "
                                 "not the tool's output")
    return ToolResult(tuple(argv), proc.returncode,
                      out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def _located(name: str) -> str:
    """``name`` and, looked up in PATH, the file it found: the one an operator has to fix."""
    if os.sep in name:
        return repr(name)
    found = next((p for d in os.get_exec_path(_ENV) if os.path.lexists(p := os.path.join(d, name))), None)
    return f"{name!r} ({found})" if found else repr(name)


def communicate_bounded(proc: subprocess.Popen[bytes], timeout_s: float,
                        max_bytes: int) -> tuple[bytes, bytes, bool]:
    """``proc.communicate(timeout=timeout_s)`` reading stdout and stderr each to at most ``max_bytes``:
    past it the reading stops and the third value is True (the caller kills the tool; communicate()
    kept every byte until the timeout). Raises subprocess.TimeoutExpired like communicate(), with what
    was read in its ``output`` and ``stderr``."""
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None and proc.stderr is not None
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:   # what was read goes with it: reap() reads only what is left
                raise subprocess.TimeoutExpired(proc.args, timeout_s, output=bytes(bufs[proc.stdout.fileno()]),
                                                stderr=bytes(bufs[proc.stderr.fileno()]))
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                buf += chunk
                if len(buf) > max_bytes:
                    out, err = bufs[proc.stdout.fileno()], bufs[proc.stderr.fileno()]
                    return bytes(out[:max_bytes]), bytes(err[:max_bytes]), True
    # both pipes at their end: the exit follows (or the tool daemonized holding none: the deadline)
    proc.wait(timeout=max(deadline - time.monotonic(), 0.001))
    out, err = bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()])
    proc.stdout.close()
    proc.stderr.close()
    return out, err, False


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
