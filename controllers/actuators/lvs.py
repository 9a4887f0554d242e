"""LVS target: integer weights through ``ipvsadm``, one batch per apply, read back with ``-Ln --exact``.

The batch is ``ipvsadm -R`` restore input, one ``-e`` (edit real server) line per real server::

    -e -t 192.0.2.10:443 -r 10.0.0.1:443 -m -w 700

The forwarding method (``-g``/``-m``/``-i``) is repeated from the live listing because an edit
without it resets the real server to the default (direct routing); so are the connection thresholds
(``-x``/``-y``, read with ``-Ln --exact --thresholds`` before each batch): the kernel sets them from every
edit (``__ip_vs_update_dest``), so an edit without them took off the limit keepalived's ``uthreshold`` or
an operator had put on an origin. So are a tunnelled real's encapsulation settings (``--tun-type``, ``--tun-port``,
``--tun-nocsum|--tun-csum|--tun-remcsum``; kernel >= 5.2), read with ``-Ln --tun-info`` (ipvsadm >= 1.30) when a
real of the target is tunnelled: libipvs sends them with every edit and the kernel takes them, so an edit without
them turned a GUE or GRE real into an IPIP one (its traffic encapsulated in what the real does not decapsulate:
lost). ``ipvsadm -R`` is not atomic
(line by line): the lines that raise a weight come first, and when it fails, the weights read before
are restored with a second ``-R`` and the error raised.
The ``-Ln`` listing is parsed by :func:`opsloop.lb.ipvs.parse_ipvsadm_list` (the LB client the LVS collector shares).
"""

from __future__ import annotations

import os
import platform
import re
import signal
import subprocess

from opsloop.collect.tool import reap
from opsloop.lb.ipvs import (LvsParseError, RealKey, RealServer, Service, ServiceKey, parse_ipvsadm_list,
                             parse_real_spec)

from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import LvsTargetConfig, parse_real, parse_service
from opsloop.controllers.actuators.mapping import IPVS_MAX_WEIGHT
from opsloop.controllers.actuators.safety import increases_first

_FORWARD_FLAGS = {"Route": "-g", "Masq": "-m", "Tunnel": "-i", "Local": "-g"}
_PROTO_FLAGS = {"tcp": "-t", "udp": "-u", "sctp": "--sctp-service", "fwm": "-f"}
# ipvsadm.c fwd_tun_info / tunflags[]: TunnelInfo ipip, gue:PORT:FLAGS, gre:FLAGS (n/a: not tunnelled)
_TUN_CSUM = {"-c": "--tun-nocsum", "+c": "--tun-csum", "r+c": "--tun-remcsum"}
# tunnel types other than ipip (GUE, GRE) came with kernel 5.2: before it, an edit cannot change an encapsulation
_TUNNEL_TYPES_SINCE = (5, 2)
_TUN_INFO = re.compile(r"^(?:(?P<none>n/a|ipip)|gue:(?P<port>\d{1,5}):(?P<gue>-c|\+c|r\+c)|gre:(?P<gre>-c|\+c|r\+c))$")


def _real_key(listed: str, service: ServiceKey) -> RealKey | None:
    try:
        return parse_real_spec(listed, service)
    except ValueError:
        return None


def kernel_has_tunnel_types(release: str | None = None) -> bool:
    """Whether this kernel (``uname -r``) knows tunnel types besides ipip; an unreadable release counts as yes
    (the safe answer: the tunnel settings are then required)."""
    m = re.match(r"(\d+)\.(\d+)", platform.release() if release is None else release)
    return m is None or (int(m[1]), int(m[2])) >= _TUNNEL_TYPES_SINCE


def _host(address: str, family: str) -> str:
    return f"[{address}]" if family == "inet6" else address


def service_args(key: ServiceKey) -> list[str]:
    if key.protocol == "fwm":
        # the kernel keys a mark service by (family, mark): without -6 (after -f, or ipvsadm fails "-6 used before
        # -f") an edit names the IPv4 service, "No such service" when only the IPv6 one exists
        return ["-f", str(key.fwmark), *(["-6"] if key.family == "inet6" else [])]
    return [_PROTO_FLAGS[key.protocol], f"{_host(key.address, key.family)}:{key.port}"]


class LvsTarget:
    kind = "lvs"
    max_weight = IPVS_MAX_WEIGHT
    quiesces = True  # a dead real is weight 0, not DOWN: a weight written to it sends traffic to it again

    def __init__(self, config: LvsTargetConfig) -> None:
        self.config = config
        self.service = parse_service(config.service)
        self.reals = {o: parse_real(r, self.service) for o, r in config.reals.items()}

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
        except OSError as e:   # not executable, a script without #!, no fork: said as the actuator's error, not raised
            raise ActuatorError(f"{self.describe()}: cannot execute {argv[0]}: {e.strerror or e}", "unreachable") \
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
            raise ActuatorError(f"{self.describe()}: virtual service {self.config.service} not in ipvsadm -Ln"
                                f"{_other_family(self.service, services)}", "missing")
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

    def _tunnels(self) -> dict[str, list[str]]:
        """Each origin's tunnel options to write again (none for IPIP, the default, or a real not tunnelled).
        The ``--tun-info`` listing has the plain one's shape with a ``TunnelInfo`` column after ``Forward``
        (ipvsadm.c); it is dropped from each real's line with ``Forward`` and read in the forward slot."""
        try:
            text = self._run(["-Ln", "--exact", "--tun-info"])
        except ActuatorError as e:
            raise ActuatorError(f"{e} (a tunnelled real's encapsulation is read with ipvsadm >= 1.30; nothing "
                                "written: an edit without it resets the real to ipip)", e.kind) from None
        lines = text.splitlines()
        if "TunnelInfo" not in "\n".join(lines[:3]):
            raise ActuatorError(f"{self.describe()}: ipvsadm -Ln --tun-info: no 'TunnelInfo' header: "
                                f"{text[:120]!r}", "parse")
        reals: list[str] = []
        na_keys: set[tuple[str, int]] = set()
        for raw in lines:
            p = raw.split()
            if p[:1] != ["->"] or len(p) != 7:
                reals.append(raw)
                continue
            reals.append(" ".join(["  ->", p[1], *p[3:]]))
            # a tunnelled real listed "n/a" (an ipvsadm that does not know its tunnel type): written as if not
            # tunnelled, the edit would make it an ipip one
            if p[2] == "Tunnel" and p[3] == "n/a" and (k := _real_key(p[1], self.service)) is not None:
                na_keys.add((k.address, k.port))
        try:
            services = parse_ipvsadm_list("\n".join(reals), "ipvsadm -Ln --tun-info")
        except LvsParseError as e:
            raise ActuatorError(f"{self.describe()}: {e}", "parse") from None
        svc = next((s for s in services if s.key == self.service), None)
        by_key = {(r.key.address, r.key.port): r for r in (svc.reals if svc else [])}
        out: dict[str, list[str]] = {}
        for origin, key in self.reals.items():
            real = by_key.get((key.address, key.port))
            m = _TUN_INFO.match(real.forward) if real is not None else None
            if m is not None and m["none"] == "n/a" and (key.address, key.port) in na_keys:
                m = None
            if m is None or (m["port"] is not None and not 0 < int(m["port"]) <= 65535):
                raise ActuatorError(f"{self.describe()}: real server {self.config.reals[origin]} ({origin}): "
                                    f"tunnel info {real.forward if real else None!r} not understood in ipvsadm -Ln "
                                    "--tun-info; nothing written", "parse")
            if m["gue"]:
                out[origin] = ["--tun-type", "gue", "--tun-port", m["port"], _TUN_CSUM[m["gue"]]]
            elif m["gre"]:
                out[origin] = ["--tun-type", "gre", _TUN_CSUM[m["gre"]]]
        return out

    def restore_input(self, weights: dict[str, int], forward: dict[str, str],
                      current: dict[str, int] | None = None,
                      thresholds: dict[str, tuple[int, int]] | None = None,
                      tunnels: dict[str, list[str]] | None = None) -> str:
        """``-R`` input; with ``current`` (the weights live now) the increases come first: ``-R`` applies
        line by line, so a batch torn part-way never leaves less total weight than before or after.
        ``thresholds``: each real's live (upper, lower) connection limits, written again (an edit resets them);
        ``tunnels``: each tunnelled real's ``--tun-*`` options, likewise."""
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
                                   *limits, *(tunnels or {}).get(origin, [])]))
        return "\n".join(lines) + "\n"

    def write(self, weights: dict[str, int]) -> None:
        unknown = sorted(set(weights) - set(self.reals))
        if unknown:
            raise ActuatorError(f"{self.describe()}: no real server configured for origin(s) {unknown}", "config")
        limits = self._thresholds()   # unreadable: nothing written (an edit without them would lift them)
        # read before the live listing (its forward column says whether they are needed), so that nothing
        # lies between that listing and the batch; needed and unreadable: nothing written (an edit without
        # them makes a GUE/GRE real an IPIP one); not needed: an ipvsadm before 1.30 (no --tun-info) is fine
        unreadable: ActuatorError | None = None
        try:
            tunnels = self._tunnels()
        except ActuatorError as e:
            tunnels, unreadable = {}, e
        live = self._live()
        forward = {o: r.forward for o, r in live.items()}
        before = {o: r.weight for o, r in live.items()}
        # an older kernel has ipip only: nothing an edit could reset (RHEL 7: kernel 3.10, ipvsadm 1.27)
        if unreadable is not None and "Tunnel" in forward.values() and kernel_has_tunnel_types():
            raise unreadable
        try:
            self._run(["-R"], self.restore_input(weights, forward, before, limits, tunnels))
        except ActuatorError as e:
            # -R is not atomic: put back what was live before, then report the original error; ordered
            # against the batch just tried (worst case fully applied), so the undo is increases-first too
            try:
                self._run(["-R"], self.restore_input(before, forward, {**before, **weights}, limits, tunnels))
                note = "previous weights restored"
            except ActuatorError as undo:
                note = f"restoring the previous weights failed too: {undo}"
            raise ActuatorError(f"{e} ({note})", e.kind) from None

    def left_alone(self) -> dict[str, str]:
        """None: every configured real is written (a dead one is quiesced to 0 by its health checker, see down())."""
        return {}

    def down(self, stored: dict[str, int] | None = None) -> set[str]:
        """Origins keepalived/ldirectord quiesced: live weight 0 where the stored weight is above 0.

        ipvsadm has no health view; a health checker with quiescent mode sets a dead real's weight to 0
        (and back to its own configured weight when it recovers). Without stored weights (nothing applied
        yet) a quiesced real cannot be told from one set to 0, so nothing is reported. The applier leaves
        out of ``stored`` the reals a write of its own, not read back and recorded, may have set to 0."""
        if not stored:
            return set()
        return {o for o, w in self.read().items() if w == 0 and stored.get(o, 0) > 0}


def _other_family(key: ServiceKey, services: list[Service]) -> str:
    """A hint when the mark is listed for the other family only (``fwm:N`` configured, ``FWM  N IPv6`` live)."""
    if key.protocol != "fwm":
        return ""
    other = next((s.key for s in services if s.key.protocol == "fwm" and s.key.fwmark == key.fwmark), None)
    return f" (the {'IPv6' if other.family == 'inet6' else 'IPv4'} one is: configure {other.label})" if other else ""


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # pgid == pid: start_new_session=True
    except ProcessLookupError:
        pass
