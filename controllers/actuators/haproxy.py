"""HAProxy target: integer weights through the runtime API (``get weight`` / ``set weight``).

A batch is written server by server (the runtime API has no transaction), increases before
decreases, so a batch torn part-way never leaves less total weight than before or after; if one
``set weight`` fails, the servers already changed are put back to the weights read before (the
error says which of those undo writes failed, if any). Note ``balance static-rr`` backends refuse
runtime weights other than 0%/100%: HAProxy's reply is raised as a command error.
"""

from __future__ import annotations

from opsloop.lb.haproxy import HaproxyAPI, HaproxyError, StatParseError, parse_show_stat

from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import HaproxyTargetConfig
from opsloop.controllers.actuators.mapping import HAPROXY_MAX_WEIGHT
from opsloop.controllers.actuators.safety import increases_first


# `show stat` statuses of a server that gets no new load-balanced traffic, whatever its weight
NOT_SERVING = ("DOWN", "MAINT", "DRAIN", "NOLB")


def _kind(error: HaproxyError) -> str:
    text = str(error)
    return "unreachable" if ("admin socket" in text or "does not exist" in text) else "command"


class HaproxyTarget:
    kind = "haproxy"
    max_weight = HAPROXY_MAX_WEIGHT
    quiesces = False  # a DOWN server keeps its weight and gets no traffic (health checks)

    def __init__(self, config: HaproxyTargetConfig, api: HaproxyAPI | None = None) -> None:
        self.config = config
        self.api = api or HaproxyAPI(config.socket, timeout_s=config.timeout_s)

    @property
    def origins(self) -> list[str]:
        return list(self.config.servers)

    def describe(self) -> str:
        return f"haproxy:{self.config.edge}/{self.config.listener}"

    def read(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for origin, server in self.config.servers.items():
            try:
                out[origin] = self.api.get_weight(self.config.backend, server)[0]
            except HaproxyError as e:
                raise ActuatorError(f"{self.describe()}: {e}", _kind(e)) from None
        return out

    def write(self, weights: dict[str, int]) -> None:
        unknown = sorted(set(weights) - set(self.config.servers))
        if unknown:
            raise ActuatorError(f"{self.describe()}: no server configured for origin(s) {unknown}", "config")
        before = self.read()
        done: list[str] = []
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
        serving, every share moved onto drained servers took the listener down (503). ``stored`` unused.
        ActuatorError when ``show stat`` fails: an unknown health view is not "nothing DOWN"."""
        try:
            rows = parse_show_stat(self.api.show_stat())
        except HaproxyError as e:
            raise ActuatorError(f"{self.describe()}: show stat: {e}", _kind(e)) from None
        except StatParseError as e:
            raise ActuatorError(f"{self.describe()}: show stat: {e}", "parse") from None
        status = {r.get("svname"): r.get("status", "") for r in rows if r.get("pxname") == self.config.backend}
        return {o for o, srv in self.config.servers.items()
                if status.get(srv, "").upper().startswith(NOT_SERVING)}
