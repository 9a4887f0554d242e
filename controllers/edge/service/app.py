"""`opsloop edge run`: the edge-weight control service: topology API + controller loop.

Data flow: ``telemetry.lb`` → stream worker's ``lb`` agent (its ``edge-demand`` handler, :mod:`opsloop.streams.edge`) →
``edge.demand`` → **this service** (every ``interval_s``: observation → ``EdgeController`` →
``edge.weights`` + ``findings`` + gauges) → actuators (``controllers/actuators``) → load balancers.

Why its own process and not a Faust timer in the stream worker: the controller is a singleton with
state (last weights, version, damping history) that must not run once per worker replica or pause
during a consumer-group rebalance; it also serves the authenticated topology API, whose changes
must apply to that same state; and a separate process restarts, scales and is secured on its own.
It only needs the newest demand per edge, a tiny stream read from the end of ``edge.demand``. On
start it recovers the last version and weights from ``edge.weights`` (highest ``(epoch, version)``
per key), so versions keep increasing across restarts and damping continues from the weights in force
(an edge with no record, e.g. one just added, starts on its nearest healthy origin: ``loop.py``);
and it takes a new, higher epoch, so its decisions win over its predecessor's even when recovery came
up short (see ``controllers/actuators/README.md``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from opsloop.controllers.edge.service import metrics as M
from opsloop.controllers.edge.service.api import EdgeApi
from opsloop.controllers.edge.service.api_token import ApiToken, TokenFile, TokenFileError
from opsloop.controllers.edge.service.config import (TOKEN_ENV, EdgeServiceSettings, load_topology, read_token,
                                             resolve_topology, service_settings, topology_path)
from opsloop.controllers.edge.service.inputs import DemandBook, DemandConsumer
from opsloop.controllers.edge.service.kafka_io import DecisionPublisher, recover_decisions
from opsloop.controllers.edge.service.loop import ControlLoop
from opsloop.controllers.edge.service.overrides import OverridesError, load_overrides
from opsloop.controllers.edge.service.store import TopologyStore
from opsloop import exitcodes
from opsloop.audit.trail import AuditLog
from opsloop.config import ConfigError, Settings, load_settings
from opsloop.file_stamp import file_stamp
from opsloop.kafka_clients import connect_with_retry, preflight_or_exit
from opsloop.log import get_logger, setup_logging
from opsloop.metrics import serve_metrics
from opsloop.kafka_admin import ensure_configured_topics

log = get_logger("controller.edge")
# how often the topology file is looked at (a stat) for a change made while the service runs
TOPOLOGY_CHECK_S = 5.0

EPILOG = """examples:
  opsloop edge run --config opsloop.yaml
  OPSLOOP_EDGE_API_TOKEN=$(cat /etc/opsloop/edge.token) opsloop edge run --config opsloop.yaml --interval 5
  opsloop edge check --config opsloop.yaml        # validate the section, the topology and the API token

config (opsloop.yaml):
  controllers:
    edge:
      interval_s: 15
      topology_file: controllers/edge/topology.yaml
      metrics_port: 29107
      api: {bind: 127.0.0.1, port: 29108, token_file: /etc/opsloop/edge.token}
      controller: {headroom: 0.05, stale_after_s: 30}
      overrides_file: .run/edge/overrides.json   # API changes kept across restarts (null: not kept)
      max_epoch_ahead_s: 10   # recovery ignores an epoch further ahead of this clock; keep it above (2x) the
                              # actuators' max_clock_skew_s, or a restarted controller can be refused for good

API (bearer token): GET /v1/status, GET|PUT /v1/listeners/L/origins/O/{capacity,health},
PUT /v1/listeners/L/edges/E/latency/O, GET /v1/listeners/L/weights; spec at /openapi.json.
  pin an origin up although the load balancers report it DOWN (only when the check is wrong):
  PUT /v1/listeners/L/origins/O/health {"healthy": true, "force": true, "reason": "CHG-1234"}
The token file must be private (chmod 600); the service refuses one that group or others can read.

exit codes of `edge run` (`edge check`: 0 ok, 2 anything wrong):
  2   bad command line
  78  configuration that can never work (config, topology, overrides file, API token from the environment, a
      token file open to others or not UTF-8, Kafka login/CA): systemd does not restart it. A token file
      missing, empty or short runs the loop with the API answering 503 until the file is fixed (re-read
      within a second of a change, as a rotated token is)
  75  /metrics or API port taken: restarted
"""


class EdgeService:
    """Wires the pieces; ``start()`` then ``run_forever()`` (or ``tick()`` from tests)."""

    def __init__(self, settings: Settings, cfg: EdgeServiceSettings, config_dir: Path | None = None,
                 token: str | ApiToken | None = None) -> None:
        self.settings = settings
        self.cfg = cfg
        # the file is read once, here: a change made while the service runs is said, not applied (check_topology_file);
        # stamped before the read, so a write during it is seen as a change
        self.topology_file = topology_path(cfg, config_dir)
        self._topology_stamp = file_stamp(self.topology_file) if self.topology_file else None
        self._topology_checked_at = time.monotonic()
        self.topology = resolve_topology(cfg, config_dir)
        self.audit = AuditLog.from_settings(settings)
        self.store = TopologyStore(self.topology, self.audit, cfg.overrides_file)
        # the keys the loop reads are never evicted by the bound on the others
        self.book = DemandBook(known=[(spec.backend_name, e.lb_name) for spec in self.topology.listeners
                                      for e in spec.edges])
        self.token = token
        self.publisher: DecisionPublisher | None = None
        self.consumer: DemandConsumer | None = None
        self.loop: ControlLoop | None = None
        self.api: EdgeApi | None = None  # when enabled
        self._stop = threading.Event()

    def start(self) -> "EdgeService":
        kafka = self.settings.kafka
        if self.cfg.api.enabled and self.token is None:
            # before Kafka: a token file that can never work is said at once, not once a broker answers. One
            # missing, empty or short (a rewrite, a secret not yet mounted) leaves the API refusing, the loop on
            if self.cfg.api.token_file is not None:
                token_file = TokenFile(self.cfg.api.token_file)
                token_file.raise_if_lasting()
                self.token = token_file
            else:
                self.token = read_token(self.cfg.api)
        preflight_or_exit(kafka, "edge-control", log)   # a wrong password or CA: exit now, say why
        recovered: dict = {}

        def connect() -> None:
            nonlocal recovered
            # the topology's pairs: the read back from the topic's end stops once each has its newest record
            expected = [(name, e.name) for name in self.store.listener_names()
                        for e in self.store.snapshot(name).spec.edges]
            recovered = recover_decisions(kafka, expected=expected, max_epoch_ahead_s=self.cfg.max_epoch_ahead_s) \
                if self.cfg.recover else {}
            self.publisher = DecisionPublisher(kafka)
            # Once a broker answers (a broker away at start would make this fail for good, and the
            # demand consumer would then wait for a topic nobody creates).
            ensure_configured_topics(kafka, log)   # not allowed (ACLs): producers still auto-create

        if not connect_with_retry(connect, self._stop, "edge-control", log):   # broker away at start: wait
            return self
        self.loop = ControlLoop(self.store, self.book, self.cfg.controller_settings(), self.publisher,
                                recovered)
        self.consumer = DemandConsumer(kafka, self.book, deadletter=self.publisher.deadletter).start()
        if self.cfg.api.enabled:
            assert self.token is not None   # read above
            self.api = EdgeApi(self.store, self.token, self.loop.status, self.loop.weights)
            self.api.serve(self.cfg.api.bind, self.cfg.api.port)
            log.info("api_serving", address=f"{self.cfg.api.bind}:{self.api.port}")
            M.API_SERVING.set(1)
        return self

    def tick(self) -> None:
        assert self.loop is not None
        self.loop.tick()
        if self.api is not None and isinstance(self.token, ApiToken):
            # the token file looked at every tick too (at most one stat a second): a file broken or fixed while
            # nobody calls the API shows in opsloop_edge_api_token_usable, and its alert fires and clears on time
            self.token.current()
        self.check_topology_file()

    def check_topology_file(self, now: float | None = None) -> None:
        """Say (once per change of the file) that the topology file changed since the start: the service runs on
        the topology it started with until restarted, and a file that no longer loads would stop that restart
        (exit 78). Before, an edit (an origin drained with ``healthy: false`` during an incident) went unapplied
        without a word, and a broken file was found only by the restart it then failed."""
        now = time.monotonic() if now is None else now
        if self.topology_file is None or now - self._topology_checked_at < TOPOLOGY_CHECK_S:
            return
        self._topology_checked_at = now
        stamp = file_stamp(self.topology_file)
        if stamp == self._topology_stamp:
            return
        self._topology_stamp = stamp
        try:
            if self.topology_file.exists() and not self.topology_file.is_file():   # a FIFO's open() held the loop
                raise ConfigError(f"topology file {self.topology_file}: not a regular file")
            spec = load_topology(self.topology_file)
        except ConfigError as e:
            log.error("topology_file_broken", file=str(self.topology_file), error=str(e)[:500],
                      consequence="not applied: the service runs on the topology it started with; a restart would "
                                  "exit 78 (`opsloop edge check`) until the file is fixed")
            return
        if spec == self.topology:
            log.info("topology_file_unchanged", file=str(self.topology_file))   # rewritten as it was: all fine
            return
        log.warning("topology_file_changed", file=str(self.topology_file),
                    consequence="not applied: the service runs on the topology it started with until it is restarted "
                                "(`opsloop edge check`, then restart); a change needed now goes through the API")

    def run_forever(self) -> None:
        """Tick on a fixed schedule (drift-free: the next tick is planned from the first)."""
        interval = self.cfg.interval_s
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.tick()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:  # a slow tick: skip the missed slots instead of bursting
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def stop(self) -> None:
        self._stop.set()
        if self.api is not None:
            self.api.stop()
        if self.consumer is not None:
            self.consumer.stop()
        if self.publisher is not None:
            self.publisher.close()
        self.audit.close()


def check_token(cfg: EdgeServiceSettings) -> str:
    """`edge check`: the API token read as `edge run` reads it (ConfigError when run would refuse it: a token
    file missing, open to others, not UTF-8, empty or short); what was checked, for the ok line. A token
    left to the environment is checked only where it is set (the service's environment may be elsewhere)."""
    if not cfg.api.enabled:
        return "API off"
    if cfg.api.token_file is None and not os.environ.get(TOKEN_ENV):
        return f"API token not checked (${TOKEN_ENV} not set here)"
    try:
        read_token(cfg.api)   # the token itself is never printed
    except TokenFileError as e:   # run does not refuse these the same way: say what it would do
        raise ConfigError(f"{e}; `edge run` would " + ("exit 78" if e.lasting else
                          "run the loop with the API answering 503 until the file is fixed")) from None
    return f"API token file {cfg.api.token_file} ok" if cfg.api.token_file is not None else f"API token ${TOKEN_ENV} ok"


def build_parser() -> argparse.ArgumentParser:
    # the help shows what the service does and its data flow; the rest of the docstring is for readers of the code
    description = "\n\n".join(__doc__.split("\n\n")[:2])
    p = argparse.ArgumentParser(prog="opsloop edge", description=description, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("run", "run the control loop and the topology API"),
                        ("check", "validate the controllers.edge section and the topology")):
        s = sub.add_parser(name, help=help_, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        s.add_argument("--config", help="opsloop YAML config")
        s.add_argument("--topology", type=Path, help="override controllers.edge.topology_file")
        if name == "check":
            s.add_argument("--skip-token", action="store_true",
                           help="do not read the API token (a config checked away from where it runs: a container's "
                                "secret file on the host)")
        if name == "run":
            s.add_argument("--interval", type=float, help="override controllers.edge.interval_s (seconds)")
            s.add_argument("--metrics-port", type=int, help="override controllers.edge.metrics_port")
            s.add_argument("--api-port", type=int, help="override controllers.edge.api.port")
            s.add_argument("--bootstrap", help="override kafka.bootstrap_servers")
            s.add_argument("--log-level", default="info")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides: dict = {"controllers": {"edge": {}}}
    edge = overrides["controllers"]["edge"]
    if args.topology is not None:
        edge["topology_file"] = str(args.topology.resolve())
        edge["topology"] = None
    if args.command == "run":
        if args.interval is not None:
            edge["interval_s"] = args.interval
        if args.metrics_port is not None:
            edge["metrics_port"] = args.metrics_port
        if args.api_port is not None:
            edge["api"] = {"port": args.api_port}
        if args.bootstrap:
            overrides["kafka"] = {"bootstrap_servers": args.bootstrap}
    try:
        settings = load_settings(args.config, overrides)
        cfg = service_settings(settings)
        config_dir = Path(args.config).resolve().parent if args.config else None
        topology = resolve_topology(cfg, config_dir)
    except ConfigError as e:
        print(f"opsloop edge: {e}", file=sys.stderr)
        return exitcodes.CONFIG if args.command == "run" else 2
    if args.command == "check":
        try:
            kept = load_overrides(cfg.overrides_file).count() if cfg.overrides_file is not None else 0
            token = "API token not checked (--skip-token)" if args.skip_token else check_token(cfg)
        except (OverridesError, ConfigError) as e:
            print(f"opsloop edge: {e}", file=sys.stderr)
            return 2
        print(f"ok: {len(topology.listeners)} listener(s): "
              + ", ".join(f"{lst.name} ({len(lst.edges)} edges, {len(lst.origins)} origins)"
                          for lst in topology.listeners)
              + f"; {kept} API override(s) kept in {cfg.overrides_file}; {token}")
        return 0
    setup_logging("opsloop-edge", args.log_level)
    try:
        server = serve_metrics(cfg.metrics_port, cfg.metrics_bind)
    except OSError as e:
        print(f"opsloop edge: {e}; set controllers.edge.metrics_port", file=sys.stderr)
        return exitcodes.TEMPFAIL   # the port may be free on the next start
    service: EdgeService | None = None
    try:
        service = EdgeService(settings, cfg, config_dir)
        service.start()
    except (ConfigError, OverridesError, OSError) as e:
        # a damaged overrides file or an unreadable token stays so on a restart; a taken API port (the only
        # OSError left: the files' errors come as the other two) may be free on the next start
        print(f"opsloop edge: {e}", file=sys.stderr)
        if service is not None:
            service.stop()   # what start() got going (the demand consumer), so the process can end
        server.shutdown()
        return exitcodes.TEMPFAIL if isinstance(e, OSError) else exitcodes.CONFIG
    log.info("started", metrics=f"{server.server_address[0]}:{server.server_address[1]}", interval_s=cfg.interval_s,
             listeners=[lst.name for lst in topology.listeners])
    signal.signal(signal.SIGTERM, lambda *_: service._stop.set())
    try:
        service.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        service.stop()
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
