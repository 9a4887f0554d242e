"""HAProxy target: integer weights through the runtime API (``get weight`` / ``set weight``).

A batch is written server by server (the runtime API has no transaction), increases before
decreases, so a batch torn part-way never leaves less total weight than before or after; if one
``set weight`` fails, the servers already changed are put back to the weights read before (the
error says which of those undo writes failed, if any). Note ``balance static-rr`` backends refuse
runtime weights other than 0%/100%: HAProxy's reply is raised as a command error.

Servers left alone (:meth:`HaproxyTarget.left_alone`, from each ``show stat``): a configured server the
backend does not have (renamed, removed by a reload) reads as weight 0, is reported DOWN and never
written (``set weight`` could only fail, and used to fail the whole listener every round); a server with an
enabled agent check (``agent-check``: ``show stat`` fills ``agent_status``) has its weight set by its agent
("75%"), which would undo every write of ours at its next check: its live weight is kept, not fought.
HAProxy 2.6 does not say whether the agent's replies carry a weight ("75%" shows as ``CHECKED`` with no
text, "up 75%" as "via agent : up"), so any enabled agent counts; ``disable agent be/srv`` hands it back.
"""

from __future__ import annotations

from opsloop.lb.haproxy import HaproxyAPI, HaproxyError, StatParseError, parse_show_stat
from opsloop.log import get_logger

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import HaproxyTargetConfig
from opsloop.controllers.actuators.mapping import HAPROXY_MAX_WEIGHT
from opsloop.controllers.actuators.safety import increases_first


# `show stat` statuses of a server that gets no new load-balanced traffic, whatever its weight
NOT_SERVING = ("DOWN", "MAINT", "DRAIN", "NOLB")
# why a configured server is left alone (the ``reason`` of opsloop_actuator_servers_left_alone)
ABSENT = "absent"
AGENT_WEIGHT = "agent_weight"
_NOT_SERVERS = ("FRONTEND", "BACKEND")

log = get_logger("actuator")


def _kind(error: HaproxyError) -> str:
    text = str(error)
    return "unreachable" if ("admin socket" in text or "does not exist" in text) else "command"


def _no_such_server(error: HaproxyError) -> bool:
    """HAProxy's answer for a server its backend does not have (the backend itself exists)."""
    return str(error).rstrip().endswith("No such server.")


class HaproxyTarget:
    kind = "haproxy"
    max_weight = HAPROXY_MAX_WEIGHT
    quiesces = False  # a DOWN server keeps its weight and gets no traffic (health checks)

    def __init__(self, config: HaproxyTargetConfig, api: HaproxyAPI | None = None) -> None:
        self.config = config
        self.api = api or HaproxyAPI(config.socket, timeout_s=config.timeout_s)
        # origin -> (reason, detail) as of the last ``show stat`` (down()): not written, live weight kept
        self._left_alone: dict[str, tuple[str, str]] = {}

    @property
    def origins(self) -> list[str]:
        return list(self.config.servers)

    def describe(self) -> str:
        return f"haproxy:{self.config.edge}/{self.config.listener}"

    def read(self) -> dict[str, int]:
        """Live weights; a server the backend does not have reads as 0 (it carries nothing; down() reports it
        and it is never written) rather than failing the whole listener."""
        out: dict[str, int] = {}
        for origin, server in self.config.servers.items():
            try:
                out[origin] = self.api.get_weight(self.config.backend, server)[0]
            except HaproxyError as e:
                if _no_such_server(e):
                    out[origin] = 0
                    continue
                raise ActuatorError(f"{self.describe()}: {e}", _kind(e)) from None
        return out

    def left_alone(self) -> dict[str, str]:
        """Origins whose server must not be written, as of the last down(): origin -> why (absent from the
        backend, weight set by its agent check). The applier keeps their live weight."""
        return {o: detail for o, (_, detail) in self._left_alone.items()}

    def write(self, weights: dict[str, int]) -> None:
        unknown = sorted(set(weights) - set(self.config.servers))
        if unknown:
            raise ActuatorError(f"{self.describe()}: no server configured for origin(s) {unknown}", "config")
        before = self.read()
        done: list[str] = []
        # a server left alone is never written: absent, set weight fails; agent-weighted, it would fight the agent
        weights = {o: w for o, w in weights.items() if o not in self._left_alone}
        # increases first: a batch torn by a dead socket then never leaves less weight than before or after
        for origin in increases_first(weights, before):
            try:
                self.api.set_weight(self.config.backend, self.config.servers[origin], weights[origin])
            except HaproxyError as e:
                undo = self._undo(done, before, origin)
                raise ActuatorError(f"{self.describe()}: {e} ({undo})", _kind(e)) from None
            done.append(origin)

    def _undo(self, done: list[str], before: dict[str, int], failing: str) -> str:
        """Put the servers already changed back; says which undo writes failed (the audit carries it).
        ``failing`` (the write that failed) is reset too: a timeout or a garbled reply does not say the
        command was not applied, and left at its new weight it is neither undone nor reported."""
        restored: list[str] = []
        failed: list[str] = []
        error = ""
        try:
            self.api.set_weight(self.config.backend, self.config.servers[failing], before[failing])
            reset = f"; {failing!r} reset to {before[failing]} (its failed write may have taken effect)"
        except HaproxyError as e:
            reset = f"; reset of {failing!r} to {before[failing]} FAILED ({str(e)[:200]})"
        # reverse order: the decreases written last are put back first (increases first again)
        for origin in reversed(done):
            try:
                self.api.set_weight(self.config.backend, self.config.servers[origin], before[origin])
                restored.append(origin)
            except HaproxyError as e:
                failed.append(origin)
                error = str(e)
        if not done:
            return "nothing written before it, nothing to undo" + reset
        text = f"undone: {restored or 'nothing'}"
        if failed:
            text += f"; undo FAILED for {failed} ({error[:200]})"
        return text + reset

    def down(self, stored: dict[str, int] | None = None) -> set[str]:
        """Origins whose server takes no new traffic: DOWN, MAINT, and DRAIN / NOLB (an operator's
        ``set server ... state drain``, an agent's drain, ``disable-on-404``; HAProxy 2.6 shows a weight of
        0 as UP, so our own 0 is none of these). ``set weight`` does not undrain a server: counted as
        serving, every share moved onto drained servers took the listener down (503). A configured server
        the backend does not have is DOWN too (counted as serving, all shares could go to it). ``stored``
        unused. Refreshes :meth:`left_alone`. ActuatorError when ``show stat`` fails: an unknown health view
        is not "nothing DOWN"."""
        try:
            rows = parse_show_stat(self.api.show_stat())
        except HaproxyError as e:
            raise ActuatorError(f"{self.describe()}: show stat: {e}", _kind(e)) from None
        except StatParseError as e:
            raise ActuatorError(f"{self.describe()}: show stat: {e}", "parse") from None
        mine = {r.get("svname", ""): r for r in rows if r.get("pxname") == self.config.backend}
        left: dict[str, tuple[str, str]] = {}
        for origin, srv in self.config.servers.items():
            row = mine.get(srv) if srv not in _NOT_SERVERS else None
            # a backend not listed at all is not judged here: its get weight fails ("No such backend.")
            if row is None and mine:
                left[origin] = (ABSENT, f"server {srv!r} not in backend {self.config.backend!r}")
            elif row is not None and row.get("agent_status", "").strip():
                left[origin] = (AGENT_WEIGHT, f"server {srv!r} weighted by its agent check "
                                              f"(agent_status {row['agent_status'].strip()[:40]})")
        self._note_left_alone(left)
        return {o for o, srv in self.config.servers.items()
                if (o in left and left[o][0] == ABSENT)
                or mine.get(srv, {}).get("status", "").upper().startswith(NOT_SERVING)}

    def _note_left_alone(self, left: dict[str, tuple[str, str]]) -> None:
        """Gauge every health read; one log line per change of the set (a reconcile reads it every interval)."""
        for reason in (ABSENT, AGENT_WEIGHT):
            metrics.LEFT_ALONE.labels(self.config.edge, self.config.listener, reason).set(
                sum(1 for r, _ in left.values() if r == reason))
        # by reason only: an agent's status text (INI, CHECKED, L4CON ...) changing is no change of ours
        if {o: r for o, (r, _) in left.items()} != {o: r for o, (r, _) in self._left_alone.items()}:
            level = log.warning if left else log.info
            level("servers_left_alone", edge=self.config.edge, listener=self.config.listener,
                  backend=self.config.backend, left_alone={o: d for o, (_, d) in left.items()},
                  before=sorted(self._left_alone))
        self._left_alone = left
