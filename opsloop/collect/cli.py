"""`opsloop collect <name>`: run one collector on an interval, publishing to Kafka (or print a round).

The collector's settings are the ``collectors.<name>`` section of the config file; the runtime's
(interval, timeout, spool) are the ``collector`` section.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pydantic import ValidationError

from opsloop.collect.publisher import Publisher
from opsloop.collect.runner import run_loop
from opsloop.collect.types import CollectorUnavailable
from opsloop.config import ConfigError, load_settings
from opsloop.log import setup_logging
from opsloop.metrics import serve_service_metrics, stop_on_signals
from opsloop.wire import describe_validation_error


EPILOG = """examples:
  opsloop collect haproxy --config opsloop.yaml --once --stdout     # one round as JSON lines, no Kafka
  opsloop collect ipmi --config opsloop.yaml                        # every collector.interval_s, to Kafka
  opsloop collect haproxy --config opsloop.yaml --interval 1 --metrics-port 0
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="opsloop collect", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="collector folder under collectors/ (haproxy, ipmi, netperf, keystone, iptables, lvs)")
    p.add_argument("--config", help="opsloop YAML config")
    p.add_argument("--once", action="store_true", help="run one round and exit")
    p.add_argument("--stdout", action="store_true", help="print samples as JSON lines (with --once: no Kafka)")
    p.add_argument("--interval", type=float, help="override collector.interval_s")
    p.add_argument("--metrics-port", type=int, help="override collector.metrics_port (0 = any free port)")
    p.add_argument("--bootstrap", help="override kafka.bootstrap_servers")
    a = p.parse_args(argv)
    overrides: dict[str, dict[str, object]] = {"collector": {}, "kafka": {}}
    if a.interval is not None:
        overrides["collector"]["interval_s"] = a.interval
    if a.metrics_port is not None:
        overrides["collector"]["metrics_port"] = a.metrics_port
    if a.bootstrap:
        overrides["kafka"]["bootstrap_servers"] = a.bootstrap
    try:
        settings = load_settings(a.config, overrides)
        mod = importlib.import_module(f"collectors.{a.name}")
    except ConfigError as e:
        print(f"opsloop collect: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError:
        print(f"opsloop collect: unknown collector {a.name!r} (no folder collectors/{a.name}/)", file=sys.stderr)
        return 2
    section = settings.collectors.get(a.name)
    if section is None:
        try:
            section = mod.Config()
        except ValidationError as e:
            print(f"opsloop collect {a.name}: the config has no collectors.{a.name} section and the defaults "
                  f"are not enough: {describe_validation_error(e, prefix=f'collectors.{a.name}.')}; see "
                  f"collectors/{a.name}/sample.yaml", file=sys.stderr)
            return 2
    setup_logging(f"opsloop-collector-{a.name}")
    try:
        collector = mod.build(section)
    except CollectorUnavailable as e:
        print(f"opsloop collect {a.name}: {e}", file=sys.stderr)
        return 1
    rt = settings.collector
    publisher = None
    if not (a.once and a.stdout):
        publisher = Publisher(settings.kafka.bootstrap_servers, rt.spool_dir / a.name, collector=a.name,
                              client_id=f"opsloop-collector-{a.name}", spool_max_bytes=rt.spool_max_bytes,
                              send_timeout_s=rt.send_timeout_s)
        if not a.once:
            if serve_service_metrics("opsloop collect", rt.metrics_port, rt.metrics_bind,
                                     "collector.metrics_port") is None:
                return 2
    stop = stop_on_signals()
    try:
        run_loop(collector, interval_s=rt.interval_s, publisher=publisher, stdout=a.stdout, once=a.once,
                 jitter_s=rt.jitter_s, stop=stop)
    except CollectorUnavailable as e:
        print(f"opsloop collect {a.name}: {e}", file=sys.stderr)
        return 1
    finally:
        if publisher is not None:
            publisher.drain()
            publisher.close()
    return 0
