"""Where on-call reads what to do: runbook and dashboard links for alert rules and findings.

The runbooks live in the repository under ``docs/runbooks/<area>.md``, one anchor per alert rule
and per finding type. A link is ``<runbook base URL>/<area>.md#<anchor>``; the base URL is the one
place a deployment says where ``docs/runbooks/`` is published (its Git forge's blob URL, an internal
docs site). It comes from ``OPSLOOP_RUNBOOK_BASE_URL`` (default :data:`DEFAULT_RUNBOOK_BASE_URL`),
and the dashboards' from ``OPSLOOP_DASHBOARD_BASE_URL`` (default: the docker-compose Grafana).

The alert rules in ``alerts/rules/`` are committed with the default bases, so ``promtool check rules``
and ``promtool test rules`` run on the files as they are; ``render-rules`` writes a copy with the
deployment's bases (the way kube-prometheus renders its ``runbook_url``)::

    python -m opsloop.runbooks render-rules --runbook-base-url https://git.corp/opsloop/-/blob/main/docs/runbooks \\
        --dashboard-base-url https://grafana.corp --out /etc/prometheus/rules alerts/rules/*.yml
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from opsloop.log import get_logger

DEFAULT_RUNBOOK_BASE_URL = "https://opsloop.example/docs/runbooks"
DEFAULT_DASHBOARD_BASE_URL = "http://127.0.0.1:3000"
RUNBOOK_BASE_ENV = "OPSLOOP_RUNBOOK_BASE_URL"
DASHBOARD_BASE_ENV = "OPSLOOP_DASHBOARD_BASE_URL"

# Finding types (detector names) -> (runbook file, anchor). Generic anomaly detectors are named
# "anomaly.<metric>.<field>" and share one section.
FINDING_RUNBOOKS: dict[str, tuple[str, str]] = {
    "firewall.unprotected_port": ("firewall.md", "firewall-unprotected-port"),
    "firewall.ruleset_drift": ("firewall.md", "firewall-ruleset-drift"),
    "firewall.package_drift": ("firewall.md", "firewall-package-drift"),
    "power.cost": ("power.md", "power-cost"),
    "power.generation_deviation": ("power.md", "power-generation-deviation"),
    "power.idle_candidate": ("power.md", "power-idle-candidate"),
    "netperf.throughput_drop": ("netperf.md", "netperf-throughput-drop"),
    "netperf.no_queue_scaling": ("netperf.md", "netperf-no-queue-scaling"),
    "keystone.latency_regime": ("keystone.md", "keystone-latency-regime"),
    "keystone.heavy_hitter": ("keystone.md", "keystone-heavy-hitter"),
    "keystone.small_request_p95": ("keystone.md", "keystone-small-request-p95"),
    "edge.capacity_shortfall": ("edge.md", "edge-capacity-shortfall"),
    "edge.weights_held": ("edge.md", "edge-weights-held"),
    "edge.fail_static": ("edge.md", "edge-fail-static"),
}
ANOMALY_PREFIX = "anomaly."
ANOMALY_RUNBOOK = ("anomaly.md", "anomaly")
# A detector nobody wrote a section for yet still lands on a page that says what to do.
UNKNOWN_FINDING_RUNBOOK = ("findings.md", "unknown-finding")

_URL = re.compile(r"^https?://[^\s/]+")
_warned: set[str] = set()
log = get_logger("runbooks")


def _base(value: str | None, env: str, default: str) -> str:
    """An explicit value must be a URL (ValueError names it); a bad environment value is logged once and
    the default used, because links are built inside detectors, which must not fail over a link."""
    if value is not None:
        if not _URL.match(value):
            raise ValueError(f"base URL {value!r} is not an http(s) URL")
        return value.rstrip("/")
    base = os.environ.get(env, "")
    if not base:
        return default
    if not _URL.match(base):
        if env not in _warned:
            _warned.add(env)
            log.error("bad_link_base_url", variable=env, value=base[:200], using=default)
        return default
    return base.rstrip("/")


def runbook_base_url(value: str | None = None) -> str:
    """The runbook base: ``value``, else ``$OPSLOOP_RUNBOOK_BASE_URL``, else the default."""
    return _base(value, RUNBOOK_BASE_ENV, DEFAULT_RUNBOOK_BASE_URL)


def dashboard_base_url(value: str | None = None) -> str:
    return _base(value, DASHBOARD_BASE_ENV, DEFAULT_DASHBOARD_BASE_URL)


def finding_runbook_path(detector: str) -> str:
    """``firewall.unprotected_port`` -> ``firewall.md#firewall-unprotected-port`` (relative to the base)."""
    if detector in FINDING_RUNBOOKS:
        page, anchor = FINDING_RUNBOOKS[detector]
    elif detector.startswith(ANOMALY_PREFIX):
        page, anchor = ANOMALY_RUNBOOK
    else:
        page, anchor = UNKNOWN_FINDING_RUNBOOK
    return f"{page}#{anchor}"


def finding_runbook_url(detector: str, base: str | None = None) -> str:
    return f"{runbook_base_url(base)}/{finding_runbook_path(detector)}"


def alert_anchor(alertname: str) -> str:
    """``OriginOverCapacity`` -> ``origin-over-capacity`` (the anchor of an alert rule's section)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", alertname).lower()


def render_rules(text: str, runbook_base: str, dashboard_base: str) -> str:
    """A rule file with the default link bases replaced by the deployment's (only in the link annotations)."""
    runbook_base, dashboard_base = runbook_base_url(runbook_base), dashboard_base_url(dashboard_base)

    def swap(m: re.Match[str]) -> str:
        key, quote, url = m.group(1), m.group(2), m.group(3)
        old, new = ((DEFAULT_RUNBOOK_BASE_URL, runbook_base) if key == "runbook_url"
                    else (DEFAULT_DASHBOARD_BASE_URL, dashboard_base))
        if url.startswith(old + "/"):
            url = new + url[len(old):]
        return f"{key}: {quote}{url}{quote}"

    return re.sub(r"\b(runbook_url|dashboard_url): (['\"]?)([^'\"\n]+)\2", swap, text)


def _render_main(args: argparse.Namespace) -> int:
    try:
        runbook_base, dashboard_base = runbook_base_url(args.runbook_base_url), dashboard_base_url(args.dashboard_base_url)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for src in args.files:
        try:
            text = src.read_text()
        except OSError as e:
            print(f"error: cannot read rule file {src}: {e.strerror}", file=sys.stderr)
            return 2
        dst = args.out / src.name
        dst.write_text(render_rules(text, runbook_base, dashboard_base))
        print(dst)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opsloop.runbooks",
        description="Runbook and dashboard links of the alert rules and findings.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python -m opsloop.runbooks render-rules --out /etc/prometheus/rules \\\n"
               "      --runbook-base-url https://git.corp/opsloop/-/blob/main/docs/runbooks \\\n"
               "      --dashboard-base-url https://grafana.corp alerts/rules/*.yml\n"
               "  python -m opsloop.runbooks finding firewall.unprotected_port")
    sub = parser.add_subparsers(dest="command", required=True)
    render = sub.add_parser("render-rules", help="copy rule files with this deployment's link bases",
                            description="Copy Prometheus rule files, replacing the default runbook_url and "
                                        "dashboard_url bases. Unset bases come from $OPSLOOP_RUNBOOK_BASE_URL "
                                        "and $OPSLOOP_DASHBOARD_BASE_URL, else the defaults.")
    render.add_argument("files", nargs="+", type=Path, help="rule files (alerts/rules/*.yml)")
    render.add_argument("--out", type=Path, required=True, help="directory to write the rendered files to")
    render.add_argument("--runbook-base-url", default=None, help=f"default {DEFAULT_RUNBOOK_BASE_URL}")
    render.add_argument("--dashboard-base-url", default=None, help=f"default {DEFAULT_DASHBOARD_BASE_URL}")
    finding = sub.add_parser("finding", help="print the runbook URL of a finding type",
                             description="Print the runbook URL of a detector's findings.")
    finding.add_argument("detector", help="e.g. firewall.unprotected_port")
    args = parser.parse_args(argv)
    if args.command == "render-rules":
        return _render_main(args)
    try:
        print(finding_runbook_url(args.detector))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
