"""One round over every BMC of the inventory: DCMI power reading, SDR Watts sensors otherwise.

Concurrency is a thread pool of ``concurrency`` workers, each running at most one ipmitool at a
time, so there are never more than ``concurrency`` ipmitool processes. Every BMC has its own
deadline (``timeout_s``, for DCMI and the SDR fallback together) and every process is killed
with its group at that deadline, so a dead or hung BMC delays nobody but itself.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from opsloop.collectors.ipmi.config import Config, ResolvedHost
from opsloop.collectors.ipmi.credentials import CredentialError, resolve_password, scrub
from opsloop.collectors.ipmi.parse import (ParseError, classify_failure, parse_dcmi_power, parse_sdr_csv, pick_total,
                                   power_sensors, preview)
from opsloop.collectors.ipmi.runner import MAX_OUTPUT_BYTES, ToolResult, run_tool
from opsloop.collect.types import CollectError, CollectorUnavailable, Round
from opsloop.records import Metric, metric
from opsloop.validation import WireError

_DCMI = ["dcmi", "power", "reading"]
_SDR = ["-c", "sdr", "elist", "full"]
# Failure kinds that mean the BMC gave no answer in time (or was not reached before the round deadline).
_UNANSWERED = frozenset({"unreachable", "timeout"})
# Start order of the next round (lowest first): not read at all, then did not answer, then answered.
_RANK_NOT_READ, _RANK_UNANSWERED, _RANK_ANSWERED = 0, 1, 2


class _ReadFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(slots=True)
class _Outcome:
    host: ResolvedHost
    metrics: list[Metric] = field(default_factory=list)
    errors: list[CollectError] = field(default_factory=list)
    calls: int = 0


class IpmiCollector:
    """The ``ipmi`` collector. ``collect()`` reads every BMC once and returns a Round."""

    name = "ipmi"

    def __init__(self, config: Config, hosts: list[ResolvedHost]) -> None:
        self.config = config
        self.hosts = hosts
        # Hosts whose BMC said "no DCMI": rounds left before DCMI is probed again.
        self._skip_dcmi: dict[str, int] = {}
        # Each host's place in the next round, (rank, -read seconds) of its last round: those not read
        # at all (the round's deadline came first) start first, else dead BMCs that eat the whole round
        # would push them out again every round, for ever; then those that did not answer, then the
        # slowest, so their timeouts overlap with the quick reads instead of forming a tail at the end.
        # Not answering ranks ahead on its own: a live BMC's one slow read (a retransmit on a loaded
        # host) can take as long as a dead one's, and is quick again next time.
        self._start_rank: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    # --- round --------------------------------------------------------------------------------

    def collect(self) -> Round:
        tool = shutil.which(self.config.ipmitool)
        if tool is None:
            raise CollectorUnavailable(
                f"ipmitool not found ({self.config.ipmitool!r}): install it (apt-get install ipmitool) "
                "or set collectors.ipmi.ipmitool to its path")
        if not os.access(tool, os.X_OK):
            raise CollectorUnavailable(f"{tool} is not executable by this user")
        rnd = Round()
        if not self.hosts:
            return rnd
        deadline = time.monotonic() + self.config.round_timeout_s
        workers = min(self.config.concurrency, len(self.hosts))
        order = sorted(self.hosts, key=lambda h: self._start_rank.get(h.name, (_RANK_ANSWERED, 0.0)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ipmi") as pool:
            outcomes = list(pool.map(lambda h: self._read_host(h, tool, deadline), order))
        for o in outcomes:
            rnd.metrics.extend(o.metrics)
            rnd.errors.extend(o.errors)
        return rnd

    # --- one BMC ------------------------------------------------------------------------------

    def _read_host(self, host: ResolvedHost, tool: str, round_deadline: float) -> _Outcome:
        out = _Outcome(host)
        started = time.monotonic()
        deadline = min(started + self.config.timeout_s, round_deadline)
        password = ""
        try:
            if started >= round_deadline:
                raise _ReadFailed("timeout", f"not read: the round passed round_timeout_s="
                                             f"{self.config.round_timeout_s:g} before this BMC's turn")
            try:
                password = resolve_password(host)
            except CredentialError as e:
                raise _ReadFailed("auth", str(e)) from None
            self._read_power(host, tool, password, deadline, out)
        except _ReadFailed as e:
            out.errors.append(CollectError(host.name, e.kind, scrub(str(e), password)))
        except Exception as e:  # noqa: BLE001 - one BMC's surprise must not fail the round
            out.errors.append(CollectError(host.name, "tool", scrub(f"{type(e).__name__}: {e}", password)))
        seconds = time.monotonic() - started
        if out.calls == 0 and any(e.kind == "timeout" for e in out.errors):
            rank = _RANK_NOT_READ   # no ipmitool ran: the round's deadline came before this BMC's turn
        elif any(e.kind in _UNANSWERED for e in out.errors):
            rank = _RANK_UNANSWERED
        else:
            rank = _RANK_ANSWERED
        with self._lock:
            self._start_rank[host.name] = (rank, -seconds)
        out.metrics.append(self._status(out, seconds))
        return out

    def _read_power(self, host: ResolvedHost, tool: str, password: str, deadline: float, out: _Outcome) -> None:
        use_dcmi = host.source == "dcmi" or (host.source == "auto" and not self._dcmi_skipped(host))
        if not use_dcmi:
            self._read_sdr(host, tool, password, deadline, out)
            return
        dcmi_failure = self._try_dcmi(host, tool, password, deadline, out)
        if dcmi_failure is None:
            return
        if host.source == "dcmi":
            raise _ReadFailed(dcmi_failure.kind, f"DCMI: {dcmi_failure}")
        try:
            self._read_sdr(host, tool, password, deadline, out)
        except _ReadFailed as e:
            # DCMI said "no measurement" and the SDR has no power sensor: the BMC has no reading.
            kind = dcmi_failure.kind if (dcmi_failure.kind, e.kind) == ("no_reading", "unsupported") else e.kind
            raise _ReadFailed(kind, f"{e}; DCMI: {dcmi_failure}") from None

    def _try_dcmi(self, host: ResolvedHost, tool: str, password: str, deadline: float,
                  out: _Outcome) -> _ReadFailed | None:
        """Read DCMI. Returns None on success, or the failure when the SDR may still answer;
        raises when the BMC itself is not usable (unreachable, login failed, timeout)."""
        res = self._run(host, tool, password, _DCMI, deadline, out)
        if res.returncode != 0:
            kind, message = classify_failure(res.stdout, res.stderr, res.returncode or -1)
            if kind == "unsupported" or "privilege" in message:
                self._remember_no_dcmi(host)
                return _ReadFailed(kind, message)
            raise _ReadFailed(kind, message)
        try:
            reading = parse_dcmi_power(res.stdout)
        except ParseError as e:
            raise _ReadFailed("parse", f"DCMI power reading: {e}") from None
        # ipmitool does not check the reply length: a short reply prints stack garbage as watts.
        plausible = self.config.max_plausible_watts
        values = [reading.watts, reading.minimum, reading.maximum, reading.average]
        if any(v is not None and v > plausible for v in values):
            raise _ReadFailed("parse", f"DCMI reading {values} W is above max_plausible_watts={plausible:g} "
                                       f"(truncated reply?); output starts with {preview(res.stdout)!r}")
        if not reading.active:
            return _ReadFailed("no_reading", "power reading state is 'deactivated' (no measurement)")
        fields: dict[str, float | int | bool | str] = {"watts": float(reading.watts)}
        for key, v in (("watts_min", reading.minimum), ("watts_max", reading.maximum),
                       ("watts_avg", reading.average), ("sample_period_s", reading.sample_period_s)):
            if v is not None:
                fields[key] = float(v) if key.startswith("watts") else v
        out.metrics.append(self._sample("ipmi_power", host, {"source": "dcmi"}, fields))
        with self._lock:
            self._skip_dcmi.pop(host.name, None)
        return None

    def _read_sdr(self, host: ResolvedHost, tool: str, password: str, deadline: float, out: _Outcome) -> None:
        res = self._run(host, tool, password, _SDR, deadline, out)
        if res.returncode != 0:
            kind, message = classify_failure(res.stdout, res.stderr, res.returncode or -1)
            raise _ReadFailed(kind, f"SDR: {message}")
        try:
            sensors = power_sensors(parse_sdr_csv(res.stdout), host.power_sensor)
        except ParseError as e:
            raise _ReadFailed("parse", f"SDR: {e}") from None
        if not sensors:
            raise _ReadFailed("unsupported", "SDR: no sensor in Watts on this BMC")
        # one implausible reading fails the whole dump (a garbled reply), before any of its sensors is kept:
        # the host's round is failed, not half published
        wild = next((s for s in sensors if s.value is not None and s.value > self.config.max_plausible_watts), None)
        if wild is not None:
            raise _ReadFailed("parse", f"SDR sensor {wild.name!r} reads {wild.value:g} W, above "
                                       f"max_plausible_watts={self.config.max_plausible_watts:g}")
        for s in sensors:
            if s.value is None:
                out.errors.append(CollectError(host.name, "no_reading",
                                               f"SDR sensor {s.name!r} has no reading (status {s.status or '?'})"))
            else:
                out.metrics.append(self._sample("ipmi_power_sensor", host, {"source": "sdr", "sensor": s.name},
                                                {"watts": s.value}))
        total = pick_total(sensors, host.power_sensor)
        if total is None:
            if host.power_sensor and not any(s.name == host.power_sensor for s in sensors):
                names = ", ".join(repr(s.name) for s in sensors)
                raise _ReadFailed("unsupported", f"no SDR power sensor named {host.power_sensor!r} (found {names})")
            # The per-sensor no_reading errors above already say which sensors.
            if out.errors:
                return
            raise _ReadFailed("no_reading", "no SDR power sensor has a reading")
        label, watts = total
        out.metrics.append(self._sample("ipmi_power", host, {"source": "sdr", "sensor": label}, {"watts": watts}))

    # --- helpers ------------------------------------------------------------------------------

    def _run(self, host: ResolvedHost, tool: str, password: str, command: list[str], deadline: float,
             out: _Outcome) -> ToolResult:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _ReadFailed("timeout", f"no time left of timeout_s={self.config.timeout_s:g} for {' '.join(command)}")
        out.calls += 1
        try:
            res = run_tool(self._argv(host, tool, command), timeout_s=remaining, env=self._env(password))
        except OSError as e:
            raise _ReadFailed("tool", f"cannot run {tool}: {e.strerror or e}") from None
        if res.timed_out:
            raise _ReadFailed("timeout", f"ipmitool {' '.join(command)} killed after {res.seconds:.1f}s "
                                         f"(per-BMC timeout_s={self.config.timeout_s:g}); BMC hung or too slow")
        if res.overflowed:
            raise _ReadFailed("tool", f"{tool} {' '.join(command)} printed more than {MAX_OUTPUT_BYTES} bytes "
                                      "and was killed: not ipmitool's output")
        return res

    def _argv(self, host: ResolvedHost, tool: str, command: list[str]) -> list[str]:
        c = self.config
        argv = [tool, "-I", c.interface, "-H", host.bmc, "-p", str(host.port)]
        if host.username:
            argv += ["-U", host.username]
        # -E: the password comes from IPMI_PASSWORD in the child's environment, never argv.
        # -v: session errors say why (bad HMAC vs no answer); it only adds stderr lines.
        argv += ["-E", "-L", c.privilege_level, "-N", str(c.retransmit_timeout_s), "-R", str(c.retries), "-v"]
        if c.interface == "lanplus":
            argv += ["-C", str(host.cipher_suite)]
        return argv + command

    @staticmethod
    def _env(password: str) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LANG": "C", "LC_ALL": "C",
                "IPMI_PASSWORD": password}

    def _dcmi_skipped(self, host: ResolvedHost) -> bool:
        with self._lock:
            left = self._skip_dcmi.get(host.name, 0)
            if left <= 0:
                return False
            self._skip_dcmi[host.name] = left - 1
            return True

    def _remember_no_dcmi(self, host: ResolvedHost) -> None:
        with self._lock:
            self._skip_dcmi[host.name] = self.config.dcmi_recheck_rounds

    def _tags(self, host: ResolvedHost, extra: dict[str, str]) -> dict[str, str]:
        tags = {"host": host.name, **extra}
        m = host.metadata
        for key, value in (("generation", m.generation), ("role", m.role), ("disks", m.disks),
                           ("raw_capacity_tb", m.raw_capacity_tb)):
            if value is not None:
                tags[key] = f"{value:g}" if isinstance(value, float) else str(value)
        return tags

    def _sample(self, name: str, host: ResolvedHost, extra_tags: dict[str, str],
                fields: dict[str, float | int | bool | str]) -> Metric:
        try:
            return metric(name, fields, self._tags(host, extra_tags), timestamp=time.time())
        except WireError as e:
            raise _ReadFailed("parse", f"sample does not fit the wire format: {e}") from None

    def _status(self, out: _Outcome, seconds: float) -> Metric:
        """Per-BMC health: up when a total power sample was read; the first error's kind."""
        fields: dict[str, float | int | bool | str] = {
            "up": any(m.name == "ipmi_power" for m in out.metrics), "read_seconds": round(seconds, 4),
            "ipmitool_calls": out.calls, "error_kind": out.errors[0].kind if out.errors else "",
        }
        return metric("ipmi_bmc", fields, self._tags(out.host, {}), timestamp=time.time())
