"""`opsloop page`: the paging actuator, and rendering the Alertmanager config for other receivers.

`opsloop page run` consumes the ``findings`` topic (consumer group ``opsloop-paging``) and keeps
one Alertmanager alert per open critical/warning finding: opened at once, re-sent while active,
resolved when the finding clears. Settings: the ``controllers.paging`` section of the config file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opsloop import exitcodes
from opsloop.config import ConfigError, load_settings
from opsloop.log import setup_logging
from opsloop.metrics import serve_service_metrics, stop_on_signals
from opsloop.redact import redact_credentials

from opsloop.controllers.paging.amconfig import render_alertmanager_config
from opsloop.paths import write_private
from opsloop.controllers.paging.config import PagingConfigError, paging_config
from opsloop.controllers.paging.service import PagingService


EPILOG = """examples:
  opsloop page run --config opsloop.yaml
  opsloop page run --config opsloop.yaml --alertmanager http://127.0.0.1:9093 --metrics-port 0
  opsloop page run --config opsloop.yaml --group-id opsloop-paging-staging --state-file /tmp/paging.json
  opsloop page render-config --webhook-url http://127.0.0.1:8099 \\
      --routing-key-file /etc/opsloop/secrets/pagerduty-routing-key --output /tmp/alertmanager.yml

The PagerDuty routing key is never an argument: it is read by Alertmanager from --routing-key-file.

exit codes of `page run` (`page render-config`: 0 written, 2 anything wrong):
  2   bad command line
  78  configuration that can never work (config, Kafka login/CA): systemd does not restart it
  75  /metrics port taken: restarted
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsloop page", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the paging actuator", epilog=EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", help="opsloop YAML config (section controllers.paging)")
    run.add_argument("--bootstrap", help="override kafka.bootstrap_servers")
    run.add_argument("--alertmanager", action="append", metavar="URL",
                     help="Alertmanager base URL (repeat for an HA pair); overrides alertmanager_urls")
    run.add_argument("--group-id", help="Kafka consumer group (default opsloop-paging)")
    run.add_argument("--metrics-port", type=int, help="serve /metrics here (0 = any free port)")
    run.add_argument("--state-file", type=Path, help="where open alerts are kept across restarts")
    run.add_argument("--resend-interval", type=float, metavar="S", help="re-send active alerts every S seconds")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    render = sub.add_parser("render-config", help="print alerts/alertmanager.yml with receivers at another URL",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    render.add_argument("--webhook-url", required=True, help="base URL; receivers post to URL/<receiver>")
    render.add_argument("--routing-key-file", required=True, type=Path, help="file holding the PagerDuty routing key")
    render.add_argument("--pagerduty-url", help="PagerDuty Events v2 endpoint (default: URL/pagerduty)")
    render.add_argument("--output", type=Path, help="write here instead of stdout")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.command == "render-config":
        return _render(a)
    return _run(a)


def _render(a: argparse.Namespace) -> int:
    try:
        text = render_alertmanager_config(webhook_url=a.webhook_url, routing_key_file=a.routing_key_file,
                                          pagerduty_url=a.pagerduty_url)
    except (OSError, ValueError) as e:
        print(f"opsloop page render-config: {redact_credentials(str(e))}", file=sys.stderr)
        return 2
    if a.output:
        try:
            write_private(a.output, text)
        except OSError as e:  # was a traceback
            print(f"opsloop page render-config: --output {a.output}: {e.strerror or e}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0


def _run(a: argparse.Namespace) -> int:
    try:
        settings = load_settings(a.config, {"kafka": {"bootstrap_servers": a.bootstrap}} if a.bootstrap else None)
        config = paging_config(settings, {"alertmanager_urls": a.alertmanager, "group_id": a.group_id,
                                          "metrics_port": a.metrics_port, "state_file": a.state_file,
                                          "resend_interval_s": a.resend_interval})
    except (ConfigError, PagingConfigError) as e:
        print(f"opsloop page: {e}", file=sys.stderr)
        return exitcodes.CONFIG
    setup_logging("opsloop-paging", a.log_level)
    if serve_service_metrics("opsloop page", config.metrics_port, config.metrics_bind,
                             "controllers.paging.metrics_port") is None:
        return exitcodes.TEMPFAIL   # the port may be free on the next start
    stop = stop_on_signals()
    PagingService(config, settings.kafka).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
