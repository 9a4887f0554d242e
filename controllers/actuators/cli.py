"""`opsloop weights`: the edge-weight actuator and its operator commands.

  run       consume edge.weights and apply this node's decisions (safety rules, /metrics, audit)
  show      live weights read from the load balancer, and the last applied version
  history   the applied versions kept in the store
  apply     apply shares by hand (same safety rules as the service: bounded step, never all-zero)
  rollback  re-apply the previous (or a given) version from the store

Settings: the ``controllers.actuator`` section of the config file (targets per edge, mode,
max_step, stale_after_s, store_dir). Every action is audited (log line + Kafka ``audit`` topic when
``controllers.audit.kafka`` is on; the service always publishes to the audit topic).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import orjson
from pydantic import ValidationError

from opsloop import exitcodes
from opsloop.audit.settings import AuditSettings
from opsloop.audit.trail import AuditLog
from opsloop.argtypes import INT64_MAX, integer
from opsloop.audit.kafka import KafkaAuditPublisher
from opsloop.config import ConfigError, load_settings
from opsloop.kafka_security import KafkaUnreachable
from opsloop.log import setup_logging
from opsloop.metrics import serve_service_metrics, stop_on_signals
from opsloop.records import EdgeWeights
from opsloop.redact import redact_credentials

from opsloop.controllers.actuators.base import ActuatorError, Target
from opsloop.controllers.actuators.config import ActuatorConfigError, actuator_config
from opsloop.controllers.actuators.service import ActuatorService, make_actuator


EPILOG = """examples:
  opsloop weights run --config opsloop.yaml --edge ams1
  opsloop weights run --config opsloop.yaml --edge ams1 --mode shadow --metrics-port 0
  opsloop weights show --config opsloop.yaml --edge ams1
  opsloop weights history --config opsloop.yaml --edge ams1 --listener web --json
  opsloop weights apply --config opsloop.yaml --edge ams1 --weights near=0.7,far=0.3 --dry-run
  opsloop weights rollback --config opsloop.yaml --edge ams1            # previous version
  opsloop weights rollback --config opsloop.yaml --edge ams1 --to 41

exit codes of `weights run` (the operator commands: 0 done, 1 not done, 2 anything wrong):
  2   bad command line
  78  configuration that can never work (config, an --edge with no target, Kafka login/CA): systemd does
      not restart it
  75  any other failure at start (a dependency not reachable), /metrics port taken: restarted
"""


class CliError(ValueError):
    pass


# history --limit: at least 1 (a slice [-n:]: 0 showed every entry and -3 all but the first three);
# rollback --to: a version as the store keeps them (a 26-digit one broke every JSON log line of the run)
limit_arg = integer(1)
version_arg = integer(0, INT64_MAX, what="a version")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsloop weights", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.add_argument("--config", help="opsloop YAML config (section controllers.actuator)")
        sp.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
        return sp

    run = add("run", "run the applier service")
    run.add_argument("--edge", action="append", help="edge(s) this node applies (default: every configured edge)")
    run.add_argument("--bootstrap", help="override kafka.bootstrap_servers")
    run.add_argument("--mode", choices=["live", "dry-run", "shadow"], help="override controllers.actuator.mode")
    run.add_argument("--metrics-port", type=int, help="serve /metrics here (0 = any free port)")
    for name, help in (("show", "live weights and the last applied version"), ("history", "applied versions"),
                       ("apply", "apply shares by hand"), ("rollback", "re-apply a previous version")):
        sp = add(name, help)
        sp.add_argument("--edge", required=True)
        sp.add_argument("--listener", help="needed when the edge has several listeners")
        if name in ("show", "history"):
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "history":
            sp.add_argument("--limit", type=limit_arg, default=20)
        if name == "apply":
            sp.add_argument("--weights", required=True, help="origin=share,... (shares summing to 1)")
            sp.add_argument("--reason", default="manual apply")
        if name == "rollback":
            sp.add_argument("--to", type=version_arg, metavar="VERSION", help="version to re-apply (default: the previous)")
            sp.add_argument("--reason", default="")
        if name in ("apply", "rollback"):
            sp.add_argument("--dry-run", action="store_true", help="compute and audit, touch nothing")
    return p


def parse_weights(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        origin, sep, value = part.partition("=")
        if not sep or not origin.strip():
            raise CliError(f"--weights: {part!r} is not origin=share")
        if origin.strip() in out:   # the later share silently won
            raise CliError(f"--weights: {origin.strip()!r} given twice")
        try:
            share = float(value)
        except ValueError:
            raise CliError(f"--weights: share of {origin.strip()!r} is not a number: {value!r}") from None
        if math.isnan(share) or not 0 <= share <= 1:
            raise CliError(f"--weights: share of {origin.strip()!r} must be in [0, 1], got {value!r}")
        out[origin.strip()] = share
    if not out:
        raise CliError("--weights: no origin=share given")
    return out


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    # the service's configuration errors are final for systemd; the operator commands say 2 for any
    refused = exitcodes.CONFIG if a.command == "run" else 2
    try:
        settings = load_settings(a.config, {"kafka": {"bootstrap_servers": a.bootstrap}}
                                 if getattr(a, "bootstrap", None) else None)
        config = actuator_config(settings, {"mode": getattr(a, "mode", None),
                                            "metrics_port": getattr(a, "metrics_port", None)})
    except (ConfigError, ActuatorConfigError) as e:
        print(f"opsloop weights: {e}", file=sys.stderr)
        return refused
    setup_logging("opsloop-actuator", a.log_level)  # JSON lines on stderr (incl. the audit line)
    try:
        if a.command == "run":
            return _run(a, settings, config)
        return _operator(a, settings, config)
    except ValidationError as e:   # shares not summing to 1: pydantic's message took four lines
        reasons = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors(include_url=False))
        print(f"opsloop weights {a.command}: {redact_credentials(reasons)}", file=sys.stderr)
        return refused
    except (CliError, ActuatorConfigError, ValueError) as e:   # run: Kafka settings its clients refused
        print(f"opsloop weights {a.command}: {e}", file=sys.stderr)
        return refused


def _audit(settings: Any, kafka: bool) -> Any:
    audit = AuditLog.from_settings(settings)
    if kafka and not AuditSettings.from_settings(settings).kafka:
        audit.sinks.append(KafkaAuditPublisher(settings.kafka, client_id="opsloop-actuator-audit"))
    return audit


def _run(a: argparse.Namespace, settings: Any, config: Any) -> int:
    edges = a.edge or config.edges
    try:
        service = ActuatorService(config, settings.kafka, edges, _audit(settings, kafka=True))
    except Exception as e:  # noqa: BLE001 - e.g. Kafka unreachable while building the audit producer
        print(f"opsloop weights run: {e}", file=sys.stderr)
        return start_failure_status(e)
    if serve_service_metrics("opsloop weights run", config.metrics_port, config.metrics_bind,
                             "controllers.actuator.metrics_port") is None:
        return exitcodes.TEMPFAIL   # the port may be free on the next start
    service.run(stop_on_signals())
    return 0


def start_failure_status(e: Exception) -> int:
    """`weights run`'s exit status for an error building the service: CONFIG for what a restart cannot cure.

    Every configuration or validation error met there is a ValueError: ConfigError, ActuatorConfigError,
    pydantic's ValidationError, KafkaSecurityError (an unreadable password or CA file), StoreError (a damaged
    history file) and ActuatorService's check that each --edge has a target. KafkaUnreachable is a
    KafkaSecurityError, but no broker answering is no settings error. Anything else (a broker or
    Elasticsearch away, an OSError) may pass: TEMPFAIL, and systemd restarts.
    """
    if isinstance(e, ValueError) and not isinstance(e, KafkaUnreachable):
        return exitcodes.CONFIG
    return exitcodes.TEMPFAIL


def _left_alone(target: Target) -> tuple[dict[str, str] | None, str | None]:
    """Servers the target does not write (HAProxy: absent from the backend, weighted by an agent check) and why,
    from a fresh health read; ``(None, error)`` when that read fails. LVS leaves none alone."""
    try:
        target.down()   # the health read (show stat) is what refreshes left_alone(); LVS without stored: no read
    except ActuatorError as e:
        return None, str(e)
    return dict(target.left_alone()), None


def _show(act: Any, as_json: bool) -> bool:
    """Print one target's live weights next to the last applied ones, and the servers it leaves alone (their live
    weight is not ours: no drift); False when the LB is unreadable."""
    try:
        live: dict[str, int] | None = act.read()
        error = None
    except ActuatorError as e:
        live, error = None, str(e)
    alone, alone_error = _left_alone(act.target) if live is not None else ({}, None)
    last = act.store.last()
    doc = {"edge": act.edge, "listener": act.listener, "target": act.target.describe(), "live": live,
           "error": error, "applied_version": last.version if last else None,
           "applied_weights": last.weights if last else None, "applied_action": last.action if last else None,
           "left_alone": alone, "left_alone_error": alone_error}
    if as_json:
        print(orjson.dumps(doc).decode())
        return live is not None
    print(f"{doc['target']}  applied version: {doc['applied_version']}" + (f" ({last.action})" if last else ""))
    if live is None:
        print(f"  live weights unavailable: {error}")
        return False
    total = sum(live.values()) or 1
    for origin, w in live.items():
        applied = last.weights.get(origin) if last else None
        if alone and origin in alone:
            flag = f"   LEFT ALONE: {alone[origin]}"
        else:
            flag = "" if applied is None or applied == w else f"   (applied {applied}: DRIFT)"
        print(f"  {origin:<20} weight {w:>6}  share {w / total:6.3f}{flag}")
    if alone_error is not None:
        print(f"  servers left alone unknown (health read failed): {alone_error}")
    return True


def _operator(a: argparse.Namespace, settings: Any, config: Any) -> int:
    audit = _audit(settings, kafka=False)
    if a.command == "show" and a.listener is None:  # every listener of the edge
        targets = config.targets_for(a.edge) or [config.target(a.edge)]
        try:
            ok = [_show(make_actuator(config, t, audit, mode="live"), a.json) for t in targets]
        finally:
            audit.close()
        return 0 if all(ok) else 1
    target_cfg = config.target(a.edge, a.listener)
    mode = "dry-run" if getattr(a, "dry_run", False) else "live"
    act = make_actuator(config, target_cfg, audit, mode=mode if a.command in ("apply", "rollback") else "live")
    try:
        if a.command == "show":
            return 0 if _show(act, a.json) else 1
        if a.command == "history":
            entries = act.store.history()[-a.limit:]
            if a.json:
                for e in entries:
                    print(orjson.dumps(e.__dict__).decode())
            else:
                for e in entries:
                    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.applied_at))
                    print(f"{when}  v{e.version:<8} {e.action:<8} {'complete' if e.complete else 'stepped '}  "
                          f"{orjson.dumps(e.weights).decode()}  {e.reason}")
            return 0
        if a.command == "apply":
            shares = parse_weights(a.weights)
            # recorded under the current version; it does not raise the version the controller must exceed
            epoch, version = act.store.high_stamp() or (0, 0)
            decision = EdgeWeights(version=version, epoch=epoch, listener=act.listener, edge=a.edge, weights=shares,
                                   computed_at=time.time(), reason=a.reason)
            res = act.apply(decision, manual=True)
        else:
            res = act.rollback(a.to, a.reason)
        print(f"{res.result}: version {res.version}; {res.reason}"
              + (f"; weights {orjson.dumps(res.after).decode()}" if res.after else ""))
        return 0 if res.result in ("applied", "noop", "rolled_back", "dry_run") else 1
    finally:
        audit.close()


if __name__ == "__main__":
    sys.exit(main())
