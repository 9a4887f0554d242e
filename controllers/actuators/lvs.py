"""LVS target: integer weights through ``ipvsadm``, one batch per apply, read back with ``-Ln --exact``.

The batch is ``ipvsadm -R`` restore input, one ``-e`` (edit real server) line per real server::

    -e -t 192.0.2.10:443 -r 10.0.0.1:443 -m -w 700

The forwarding method (``-g``/``-m``/``-i``) is repeated from the live listing because an edit
without it resets the real server to the default (direct routing); so are the connection thresholds
(``-x``/``-y``, read with ``-Ln --exact --thresholds`` before each batch): the kernel sets them from every
edit (``__ip_vs_update_dest``), so an edit without them took off the limit keepalived's ``uthreshold`` or
an operator had put on an origin. ``ipvsadm -R`` is not atomic
(line by line): the lines that raise a weight come first, and when it fails, the weights read before
are restored with a second ``-R`` and the error raised.
The ``-Ln`` listing is parsed by :func:`opsloop.lb.ipvs.parse_ipvsadm_list` (the LB client the LVS collector shares).
"""

from __future__ import annotations

import os
import signal
import subprocess

from opsloop.collect.tool import reap
from opsloop.lb.ipvs import (LvsParseError, RealServer, ServiceKey, parse_ipvsadm_list, parse_real_spec,
                             parse_service_spec)

from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import LvsTargetConfig
from opsloop.controllers.actuators.mapping import IPVS_MAX_WEIGHT
from opsloop.controllers.actuators.safety import increases_first

_FORWARD_FLAGS = {"Route": "-g", "Masq": "-m", "Tunnel": "-i", "Local": "-g"}
_PROTO_FLAGS = {"tcp": "-t", "udp": "-u", "sctp": "--sctp-service", "fwm": "-f"}


def _host(address: str, family: str) -> str:
    return f"[{address}]" if family == "inet6" else address


def service_args(key: ServiceKey) -> list[str]:
    if key.protocol == "fwm":
        return ["-f", str(key.fwmark)]
    return [_PROTO_FLAGS[key.protocol], f"{_host(key.address, key.family)}:{key.port}"]


class LvsTarget:
    kind = "lvs"
    max_weight = IPVS_MAX_WEIGHT
    quiesces = True  # a dead real is weight 0, not DOWN: a weight written to it sends traffic to it again

    def __init__(self, config: LvsTargetConfig) -> None:
        self.config = config
        self.service = parse_service_spec(config.service)
        self.reals = {o: parse_real_spec(r) for o, r in config.reals.items()}

    @property
    def origins(self) -> list[str]:
        return list(self.config.reals)

    def describe(self) -> str:
        return f"lvs:{self.config.edge}/{self.config.listener}"

    def _run(self, args: list[str], stdin: str | None = None) -> str:
        argv = [*self.config.command, *args]
        try:
            # A process group of its own, killed whole on timeout: subprocess.run killed only the direct
            # child, so under a wrapper (sudo) a hung ipvsadm lived on, one per retry, and a late write
            # could put old weights back after a newer apply.
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)
        except FileNotFoundError:
            raise ActuatorError(f"{self.describe()}: cannot execute {argv[0]} (install ipvsadm)", "unreachable") \
                from None
        try:
            stdout, stderr = proc.communicate(stdin, timeout=self.config.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            reap(proc)  # type: ignore[arg-type]
            raise ActuatorError(f"{self.describe()}: {' '.join(argv[-3:])} timed out after "
                                f"{self.config.timeout_s}s", "unreachable") from None
        except BaseException:
            _kill_group(proc)
            reap(proc)  # type: ignore[arg-type]
            raise
        if proc.returncode != 0:
            err = (stderr.strip() or stdout.strip() or "no output").splitlines()
            kind = "unreachable" if any("initialize ipvs" in e for e in err) else "command"
            raise ActuatorError(f"{self.describe()}: ipvsadm {' '.join(args[:2])} exit {proc.returncode}: "
                                f"{' | '.join(err[-3:])[:300]}", kind)
        return stdout

    def _live(self) -> dict[str, RealServer]:
        text = self._run(["-Ln", "--exact"])
        try:
            services = parse_ipvsadm_list(text)
        except LvsParseError as e:
            raise ActuatorError(f"{self.describe()}: {e}", "parse") from None
        svc = next((s for s in services if s.key == self.service), None)
        if svc is None:
            raise ActuatorError(f"{self.describe()}: virtual service {self.config.service} not in ipvsadm -Ln",
                                "missing")
        by_key = {(r.key.address, r.key.port): r for r in svc.reals}
        out: dict[str, RealServer] = {}
        for origin, key in self.reals.items():
            real = by_key.get((key.address, key.port))
            if real is None:
                raise ActuatorError(f"{self.describe()}: real server {self.config.reals[origin]} ({origin}) not in "
                                    f"virtual service {self.config.service}", "missing")
            out[origin] = real
        return out

    def read(self) -> dict[str, int]:
        return {o: r.weight for o, r in self._live().items()}

    def _thresholds(self) -> dict[str, tuple[int, int]]:
        """Each origin's (upper, lower) connection threshold, 0 = none. The ``--thresholds`` listing has the
        plain one's shape with ``Uthreshold Lthreshold`` where ``Forward Weight`` stand (ipvsadm.c)."""
        text = self._run(["-Ln", "--exact", "--thresholds"])
        if "Uthreshold" not in "\n".join(text.splitlines()[:3]):
            raise ActuatorError(f"{self.describe()}: ipvsadm -Ln --thresholds: no 'Uthreshold' header: "
                                f"{text[:120]!r}", "parse")
        try:
            services = parse_ipvsadm_list(text, "ipvsadm -Ln --thresholds")
        except LvsParseError as e:
            raise ActuatorError(f"{self.describe()}: {e}", "parse") from None
        svc = next((s for s in services if s.key == self.service), None)
        by_key = {(r.key.address, r.key.port): r for r in (svc.reals if svc else [])}
        out: dict[str, tuple[int, int]] = {}
        for origin, key in self.reals.items():
            real = by_key.get((key.address, key.port))
            if real is None or not real.forward.isdigit():   # its forward column is the upper threshold
                raise ActuatorError(f"{self.describe()}: real server {self.config.reals[origin]} ({origin}): no "
                                    "thresholds in ipvsadm -Ln --thresholds", "parse")
            out[origin] = (int(real.forward), real.weight)
        return out

    def restore_input(self, weights: dict[str, int], forward: dict[str, str],
                      current: dict[str, int] | None = None,
                      thresholds: dict[str, tuple[int, int]] | None = None) -> str:
        """``-R`` input; with ``current`` (the weights live now) the increases come first: ``-R`` applies
        line by line, so a batch torn part-way never leaves less total weight than before or after.
        ``thresholds``: each real's live (upper, lower) connection limits, written again (an edit resets them)."""
        lines = []
        for origin in increases_first(weights, current or {}):
            weight = weights[origin]
            if not 0 <= weight <= IPVS_MAX_WEIGHT:
                raise ActuatorError(f"{self.describe()}: weight {weight} for {origin} outside 0..65535", "config")
            real = self.reals[origin]
            upper, lower = (thresholds or {}).get(origin, (0, 0))
            limits = ["-x", str(upper), "-y", str(lower)] if upper or lower else []
            lines.append(" ".join(["-e", *service_args(self.service), "-r",
                                   f"{_host(real.address, real.family)}:{real.port}",
                                   _FORWARD_FLAGS.get(forward.get(origin, "Route"), "-g"), "-w", str(weight),
                                   *limits]))
        return "\n".join(lines) + "\n"

    def write(self, weights: dict[str, int]) -> None:
        unknown = sorted(set(weights) - set(self.reals))
        if unknown:
            raise ActuatorError(f"{self.describe()}: no real server configured for origin(s) {unknown}", "config")
        limits = self._thresholds()   # unreadable: nothing written (an edit without them would lift them)
        live = self._live()
        forward = {o: r.forward for o, r in live.items()}
        before = {o: r.weight for o, r in live.items()}
        try:
            self._run(["-R"], self.restore_input(weights, forward, before, limits))
        except ActuatorError as e:
            # -R is not atomic: put back what was live before, then report the original error; ordered
            # against the batch just tried (worst case fully applied), so the undo is increases-first too
            try:
                self._run(["-R"], self.restore_input(before, forward, {**before, **weights}, limits))
                note = "previous weights restored"
            except ActuatorError as undo:
                note = f"restoring the previous weights failed too: {undo}"
            raise ActuatorError(f"{e} ({note})", e.kind) from None

    def down(self, stored: dict[str, int] | None = None) -> set[str]:
        """Origins keepalived/ldirectord quiesced: live weight 0 where the stored weight is above 0.

        ipvsadm has no health view; a health checker with quiescent mode sets a dead real's weight to 0
        (and back to its own configured weight when it recovers). Without stored weights (nothing applied
        yet) a quiesced real cannot be told from one set to 0, so nothing is reported. The applier leaves
        out of ``stored`` the reals a write of its own, not read back and recorded, may have set to 0."""
        if not stored:
            return set()
        return {o for o, w in self.read().items() if w == 0 and stored.get(o, 0) > 0}


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # pgid == pid: start_new_session=True
    except ProcessLookupError:
        pass
