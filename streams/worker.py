"""`opsloop stream worker`: the Faust worker running every stream agent, with /metrics on loopback."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import faust

from opsloop import exitcodes
from opsloop.config import ConfigError, Settings, load_settings
from opsloop.kafka_clients import preflight_or_exit
from opsloop.log import (KAFKA_CLIENT_LOGGERS, KAFKA_CLIENT_LOGS, JsonFormatter, get_logger, quiet_loggers,
                         setup_logging)
from opsloop.metrics import serve_metrics
from opsloop.kafka_admin import ensure_configured_topics
from opsloop.topics import Topic
from opsloop.streams.agents.register import register_detector_agents
from opsloop.streams.edge.agent import edge_demand_stage
from opsloop.streams.lb.rates import LbRates
from opsloop.streams.runtime.app import batch_agent, create_app
from opsloop.streams.runtime.gc_tuning import tune_gc

log = get_logger("stream.worker")
LB_AGENT = "lb"

EPILOG = """examples:
  opsloop stream worker --config opsloop.yaml
  opsloop stream worker --config opsloop.yaml --metrics-port 29100 --log-level debug

exit codes:
  2   bad command line
  78  configuration that can never work (config file, Kafka login/CA): systemd does not restart it
  75  /metrics port taken: restarted
  70  table recovery made no progress for stream.recovery_stall_s (log event recovery_stalled names the
      partitions): run the worker under a supervisor that restarts it (opsloop run, systemd
      Restart=on-failure); see streams/runtime/watchdog.py
"""


def build_app(settings: Settings, app_id: str | None = None) -> faust.App:
    """The app with every agent registered (one place: the data flow reads top to bottom)."""
    app = create_app(settings, app_id)
    # telemetry.lb: request-rate gauges, then edge demand from the same rates -> edge.demand (controllers/edge)
    rates = LbRates.from_settings(settings.stream)   # series_ttl_s; capped at stream.max_state_keys
    demand, send_demand = edge_demand_stage(app, settings, rates)
    batch_agent(app, LB_AGENT, [Topic.LB], [rates, demand], settings, after_batch=[send_demand])
    register_detector_agents(app, settings)   # every registered detector (streams/detectors/registry.py) -> findings
    return app


def _logging_config(level: str) -> dict[str, object]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        # Faust replaces setup_logging's handler: the same limiter on its own (aiokafka logs each retry of each loop)
        "filters": {"kafka_client": {"()": lambda: KAFKA_CLIENT_LOGS}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr",
                                "filters": ["kafka_client"]}},
        "root": {"handlers": ["stderr"], "level": level.upper()},
        # the Kafka clients' own lines at --log-level debug (quiet_loggers), Faust's transport and mode stay quiet
        "loggers": {**{n: {"level": "WARNING"} for n in ("faust.transport", "mode")},
                    **{n: {"level": logging.getLevelName(pinned)} for n, pinned in quiet_loggers(level).items()
                       if n in KAFKA_CLIENT_LOGGERS}},
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsloop stream worker", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="opsloop YAML config (defaults apply when omitted)")
    p.add_argument("--metrics-port", type=int, help="override stream.metrics_port")
    p.add_argument("--bootstrap", help="override kafka.bootstrap_servers")
    p.add_argument("--log-level", help="override stream.log_level")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides: dict[str, dict[str, object]] = {"stream": {}, "kafka": {}}
    if args.metrics_port is not None:
        overrides["stream"]["metrics_port"] = args.metrics_port
    if args.log_level:
        overrides["stream"]["log_level"] = args.log_level
    if args.bootstrap:
        overrides["kafka"]["bootstrap_servers"] = args.bootstrap
    try:
        settings = load_settings(args.config, overrides)
    except ConfigError as e:
        print(f"opsloop stream worker: {e}", file=sys.stderr)
        return exitcodes.CONFIG
    setup_logging("opsloop-stream", settings.stream.log_level)
    try:
        server = serve_metrics(settings.stream.metrics_port, settings.stream.metrics_bind)
    except OSError as e:
        print(f"opsloop stream worker: {e}; set stream.metrics_port", file=sys.stderr)
        return exitcodes.TEMPFAIL   # the port may be free on the next start
    log.info("metrics_serving", address=f"{server.server_address[0]}:{server.server_address[1]}")
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    preflight_or_exit(settings.kafka, "stream-worker", log)   # a wrong password or CA: exit now, say why
    ensure_configured_topics(settings.kafka, log)   # not allowed: Faust will still create what it needs
    app = build_app(settings)
    tune_gc()
    worker = faust.Worker(app, loglevel=settings.stream.log_level, logging_config=_logging_config(
        settings.stream.log_level), redirect_stdouts=False, quiet=True)
    worker.execute_from_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
