"""`opsloop collect <name>`: run one collector on an interval, publishing to Kafka (or print a round).

The collector's settings are the ``collectors.<name>`` section of the config file; the runtime's
(interval, timeout, spool) are the ``collector`` section.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pydantic import ValidationError

from opsloop import exitcodes
from opsloop.collect.publisher import Publisher
from opsloop.collect.runner import run_loop, run_once
from opsloop.collect.types import CollectorUnavailable, Round
from opsloop.config import ConfigError, collector_names, load_settings
from opsloop.kafka_clients import preflight_or_exit
from opsloop.log import get_logger, setup_logging
from opsloop.metrics import serve_service_metrics, stop_on_signals
from opsloop.validation import describe_validation_error


EPILOG = """examples:
  opsloop collect haproxy --config opsloop.yaml --once --stdout     # one round as JSON lines, no Kafka
  opsloop collect ipmi --config opsloop.yaml                        # every collector.interval_s, to Kafka
  opsloop collect haproxy --config opsloop.yaml --interval 1 --metrics-port 0

exit codes (--once: 0 or 1 for the round, as its help says; the others as without it):
  2   bad command line
  78  configuration that can never work (config, the collector's section or files, Kafka login/CA,
      collector.spool_dir): systemd does not restart it
  75  /metrics port taken: restarted
  1   the collector cannot run here (CollectorUnavailable: a tool or device missing)
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsloop collect", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=collector_names(), metavar="name",
                   help="collector folder under collectors/: %(choices)s")
    p.add_argument("--config", help="opsloop YAML config")
    p.add_argument("--once", action="store_true",
                   help="run one round and exit: 0 when every target answered, 1 when the collector could not "
                        "run, a target failed or nothing was collected (the reason on stderr)")
    p.add_argument("--stdout", action="store_true", help="print samples as JSON lines (with --once: no Kafka)")
    p.add_argument("--interval", type=float, help="override collector.interval_s")
    p.add_argument("--metrics-port", type=int, help="override collector.metrics_port (0 = any free port)")
    p.add_argument("--bootstrap", help="override kafka.bootstrap_servers")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    overrides: dict[str, dict[str, object]] = {"collector": {}, "kafka": {}}
    if a.interval is not None:
        overrides["collector"]["interval_s"] = a.interval
    if a.metrics_port is not None:
        overrides["collector"]["metrics_port"] = a.metrics_port
    if a.bootstrap:
        overrides["kafka"]["bootstrap_servers"] = a.bootstrap
    try:
        settings = load_settings(a.config, overrides)
        mod = importlib.import_module(f"opsloop.collectors.{a.name}")
    except ConfigError as e:
        print(f"opsloop collect: {e}", file=sys.stderr)
        return exitcodes.CONFIG
    except ModuleNotFoundError as e:  # a dependency of the collector is missing (the name itself was checked)
        print(f"opsloop collect {a.name}: cannot import the collector: {e}", file=sys.stderr)
        return exitcodes.CONFIG   # an install to fix, not a moment to wait out
    section = settings.collectors.get(a.name)
    if section is None:
        try:
            section = mod.Config()
        except ValidationError as e:
            print(f"opsloop collect {a.name}: the config has no collectors.{a.name} section and the defaults "
                  f"are not enough: {describe_validation_error(e, prefix=f'collectors.{a.name}.')}; see "
                  f"collectors/{a.name}/sample.yaml", file=sys.stderr)
            return exitcodes.CONFIG
    setup_logging(f"opsloop-collector-{a.name}")
    try:
        collector = mod.build(section)
    except CollectorUnavailable as e:
        print(f"opsloop collect {a.name}: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # a file the section names is unusable (the IPMI inventory): was a traceback
        print(f"opsloop collect {a.name}: {e}", file=sys.stderr)
        return exitcodes.CONFIG
    rt = settings.collector
    publisher = None
    if not (a.once and a.stdout):
        preflight_or_exit(settings.kafka, f"collector-{a.name}", get_logger("collector"))   # wrong password/CA: exit
        try:
            publisher = Publisher(settings.kafka, rt.spool_dir / a.name, collector=a.name,
                                  client_id=f"opsloop-collector-{a.name}", spool_max_bytes=rt.spool_max_bytes,
                                  send_timeout_s=rt.send_timeout_s)
        except OSError as e:   # no spool, no delivery guarantee: refuse to start, say which setting
            print(f"opsloop collect {a.name}: collector.spool_dir {rt.spool_dir / a.name}: cannot use the spool "
                  f"directory ({e.strerror or e})", file=sys.stderr)
            return exitcodes.CONFIG
        if not a.once:
            if serve_service_metrics("opsloop collect", rt.metrics_port, rt.metrics_bind,
                                     "collector.metrics_port") is None:
                return exitcodes.TEMPFAIL   # the port may be free on the next start
    try:
        if a.once:
            return once_status(a.name, run_once(collector, publisher=publisher, stdout=a.stdout,
                                                timeout_s=rt.timeout_s))
        run_loop(collector, interval_s=rt.interval_s, publisher=publisher, stdout=a.stdout,
                 jitter_s=rt.jitter_s, stop=stop_on_signals())
    except CollectorUnavailable as e:
        print(f"opsloop collect {a.name}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - only --once gets here (the loop logs and goes on): say what failed
        print(f"opsloop collect {a.name}: the round failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if publisher is not None:
            publisher.close()   # flushes what is queued (within collector.send_timeout_s); the rest stays spooled
    return 0


def once_status(name: str, rnd: Round) -> int:
    """Exit status of `--once`: a round that failed a target or collected nothing is an error, said on stderr."""
    if rnd.errors:
        failed = "; ".join(f"{e.target}: {e.kind}: {e.message}" for e in rnd.errors)
        print(f"opsloop collect {name}: {len(rnd.errors)} target(s) failed: {failed}", file=sys.stderr)
        return 1
    if not rnd.metrics:
        print(f"opsloop collect {name}: the round collected no sample and no target reported an error; check "
              f"collectors.{name} in the config (see collectors/{name}/sample.yaml)", file=sys.stderr)
        return 1
    return 0
