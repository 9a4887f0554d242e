"""The two drivers: how to start one measurement process and how to read its outcome.

``netperf``: one process per stream (``-t TCP_STREAM`` with omni output selectors, ``-P 0``, ``-f m``).
``iperf3``: one process per target carrying all its streams (``-P N``): an iperf3 server runs one
test at a time and answers a second client with "the server is busy".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from opsloop.collectors.netperf.config import Target, TargetSet
from opsloop.collectors.netperf.parse import (OMNI_SELECTORS, ParseError, StreamResult, ToolReportedError,
                                      parse_iperf3, parse_netperf, preview)
from opsloop.collectors.netperf.runner import Completed

TEST = "TCP_STREAM"
# Substrings of the tools' messages that mean "nobody answered at that address".
_NETPERF_UNREACHABLE = ("establish control", "establish_control", "could not resolve", "connect failed")
_IPERF3_UNREACHABLE = ("unable to connect", "connection refused", "no route to host", "name or service not known",
                       "server is busy", "connection timed out", "connection reset", "temporary failure in name")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One process's outcome: a result, or an error kind (opsloop.collect.types.ERROR_KINDS) and message."""

    target: Target
    result: StreamResult | None = None
    kind: str | None = None
    message: str | None = None
    short: bool = False  # a result whose stream ended well before run_s (counted as a failure)

    @property
    def ok(self) -> bool:
        return self.result is not None


class Driver(Protocol):
    name: str

    def argv(self, tset: TargetSet, target: Target, index: int) -> list[str]: ...

    def processes_per_target(self, tset: TargetSet) -> int: ...

    def interpret(self, done: Completed, tset: TargetSet, target: Target, timeout_s: float) -> Outcome: ...


def _first_line(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line[:200]


def _timeout(tool: str, target: Target, timeout_s: float) -> Outcome:
    return Outcome(target, kind="timeout",
                   message=f"{tool} to {target} ran past its deadline of {timeout_s:.1f}s and was killed")


def _netns_failure(done: Completed, target: Target) -> Outcome | None:
    if "Cannot open network namespace" in done.output:
        return Outcome(target, kind="tool", message=_first_line(done.output))
    return None


class NetperfDriver:
    name = "netperf"

    def __init__(self, path: str = "netperf") -> None:
        self.path = path

    def processes_per_target(self, tset: TargetSet) -> int:
        return tset.streams_per_target

    def argv(self, tset: TargetSet, target: Target, index: int) -> list[str]:
        argv = [self.path, "-H", target.host, "-p", str(target.port), "-t", TEST, "-l", str(tset.run_s),
                "-P", "0", "-f", "m", "--", "-k" if tset.omni_output == "keyval" else "-o", ",".join(OMNI_SELECTORS)]
        if tset.data_port is not None:
            argv += ["-P", f",{tset.data_port + index}"]  # local port left to the kernel
        return argv

    def interpret(self, done: Completed, tset: TargetSet, target: Target, timeout_s: float) -> Outcome:
        if done.timed_out:
            return _timeout("netperf", target, timeout_s)
        if done.returncode == 0:
            try:
                result = parse_netperf(done.stdout, tset.omni_output)
            except ParseError as e:
                return Outcome(target, kind="parse", message=f"{target}: {e}")
            if result.elapsed_s is None:
                # We asked for ELAPSED_TIME: without it the output is torn, and a run cut short looks whole.
                return Outcome(target, kind="parse",
                               message=f"{target}: netperf output lacks ELAPSED_TIME: {preview(done.stdout)}")
            return Outcome(target, result=result)
        netns = _netns_failure(done, target)
        if netns:
            return netns
        lowered = done.output.lower()
        if done.returncode == 255 or any(s in lowered for s in _NETPERF_UNREACHABLE):
            return Outcome(target, kind="unreachable",
                           message=f"no netserver answering at {target} (is `netserver -p {target.port}` "
                                   f"running there?): {_first_line(done.output) or f'exit {done.returncode}'}")
        return Outcome(target, kind="tool",
                       message=f"netperf to {target} exited {done.returncode}: {preview(done.output)}")


class Iperf3Driver:
    name = "iperf3"

    def __init__(self, path: str = "iperf3") -> None:
        self.path = path

    def processes_per_target(self, tset: TargetSet) -> int:
        return 1

    def argv(self, tset: TargetSet, target: Target, index: int) -> list[str]:
        connect_ms = int(min(tset.timeout_margin_s, 10.0) * 1000)
        return [self.path, "-c", target.host, "-p", str(target.port), "-t", str(tset.run_s), "-J",
                "-P", str(tset.streams_per_target), "--connect-timeout", str(connect_ms)]

    def interpret(self, done: Completed, tset: TargetSet, target: Target, timeout_s: float) -> Outcome:
        if done.timed_out:
            return _timeout("iperf3", target, timeout_s)
        netns = _netns_failure(done, target)
        if netns:
            return netns
        try:
            return Outcome(target, result=parse_iperf3(done.stdout))
        except ToolReportedError as e:
            text = str(e)
            kind = "unreachable" if any(s in text.lower() for s in _IPERF3_UNREACHABLE) else "tool"
            return Outcome(target, kind=kind, message=f"{target}: {text}")
        except ParseError as e:
            if done.returncode not in (0, None):
                return Outcome(target, kind="tool",
                               message=f"iperf3 to {target} exited {done.returncode}: {preview(done.output)}")
            return Outcome(target, kind="parse", message=f"{target}: {e}")


def check_length(outcome: Outcome, tset: TargetSet, tool: str) -> Outcome:
    """A result whose stream ran less than ``min_elapsed_ratio`` x ``run_s`` becomes a failure: netperf
    exits 0 with a valid result when interrupted (SIGINT) or given a shorter -l, and that rate, taken
    while the other streams still ran, is not the link's throughput over the run."""
    r = outcome.result
    if r is None or r.elapsed_s is None or r.elapsed_s >= tset.min_elapsed_ratio * tset.run_s:
        return outcome
    return Outcome(outcome.target, kind="tool", short=True,
                   message=f"{tool} to {outcome.target} ran {r.elapsed_s:g}s of run_s={tset.run_s} (below "
                           f"min_elapsed_ratio={tset.min_elapsed_ratio:g}): it ended early (netserver/iperf3 "
                           "stopped or the client interrupted); its throughput is left out")


def driver_for(name: str, netperf_path: str, iperf3_path: str) -> Driver:
    return NetperfDriver(netperf_path) if name == "netperf" else Iperf3Driver(iperf3_path)
