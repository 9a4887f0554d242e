"""One round of the LVS collector: services, real servers and totals with counters and rates."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from opsloop.collect.types import CollectError, CollectorUnavailable, Round
from opsloop.records import Metric, metric

from opsloop.collectors.lvs.config import Config
from opsloop.lb.ipvs import (RATE_FIELDS, STAT_FIELDS, IpvsadmListing, LvsParseError, RealKey, Service,
                                  ServiceKey, parse_ipvsadm, parse_proc_ip_vs, parse_proc_ip_vs_stats)
from opsloop.collectors.lvs.rates import RateTracker, Rates
from opsloop.collect.tool import ToolMissing, ToolOutputTooLarge, ToolTimeout, run_tool

_UNAVAILABLE_KINDS = frozenset({"unsupported", "tool"})


class SourceFailed(Exception):
    def __init__(self, source: str, kind: str, message: str) -> None:
        super().__init__(message)
        self.source, self.kind = source, kind


class LvsCollector:
    """Reads /proc/net/ip_vs*, and ipvsadm listings; keeps previous counters to compute rates."""

    name = "lvs"

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._tracker = RateTracker()

    def collect(self) -> Round:
        cfg = self.config
        errors: list[SourceFailed] = []
        attempted = 0

        def attempt(fn, *args):
            nonlocal attempted
            attempted += 1
            try:
                return fn(*args)
            except SourceFailed as e:
                errors.append(e)
                return None

        services = attempt(self._read_file, cfg.proc_ip_vs, parse_proc_ip_vs) if cfg.proc_ip_vs else None
        totals = attempt(self._read_file, cfg.proc_ip_vs_stats, parse_proc_ip_vs_stats) if cfg.proc_ip_vs_stats else None
        # Each counter source is timed when it was read: a clock read after the later sources put a slow or
        # hung ipvsadm's seconds (up to timeout_s) into the interval of counters read before it, so one
        # round's rates came out too low and the next round's too high.
        totals_at = self._clock()
        stats = attempt(self._read_ipvsadm, cfg.ipvsadm_stats_command, "stats") if cfg.ipvsadm_stats_command else None
        stats_at = self._clock()
        rates = attempt(self._read_ipvsadm, cfg.ipvsadm_rate_command, "rate") if cfg.ipvsadm_rate_command else None
        ts = time.time()

        if len(errors) == attempted and all(e.kind in _UNAVAILABLE_KINDS for e in errors):
            raise CollectorUnavailable(
                "LVS is not available on this host: " + "; ".join(f"{e.source}: {e}" for e in errors)
                + ". Load the ip_vs kernel module and install ipvsadm, or point the sources elsewhere.")

        out = Round(errors=[CollectError(e.source, e.kind, str(e)) for e in errors])
        out.metrics.extend(self._service_metrics(services, stats, rates, stats_at, ts))
        if totals is not None:
            out.metrics.append(self._totals_metric(totals, totals_at, ts))
        self._tracker.end_round()
        return out

    # -- sources ----------------------------------------------------------------------------

    def _read_file(self, path: Path, parser):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            raise SourceFailed(str(path), "unsupported",
                               f"{path} does not exist: IPVS is not loaded (modprobe ip_vs)") from None
        except PermissionError:
            raise SourceFailed(str(path), "permission", f"{path}: permission denied") from None
        except OSError as e:
            raise SourceFailed(str(path), "tool", f"{path}: {e.strerror or e}") from None
        try:
            return parser(text, str(path))
        except LvsParseError as e:
            raise SourceFailed(str(path), "parse", str(e)) from None

    def _read_ipvsadm(self, argv: list[str], expect: str) -> IpvsadmListing:
        source = " ".join(argv)
        try:
            res = run_tool(argv, self.config.timeout_s)
        except (ToolMissing, ToolOutputTooLarge) as e:
            raise SourceFailed(source, "tool", str(e)) from None
        except ToolTimeout as e:
            raise SourceFailed(source, "timeout", str(e)) from None
        if res.returncode != 0:
            err = " ".join(res.stderr.split())[:300] or "(no output)"
            low = err.lower()
            if "can't initialize ipvs" in low or "protocol not available" in low:
                raise SourceFailed(source, "unsupported", f"IPVS is not available in this kernel: {err}")
            if "permission denied" in low or "operation not permitted" in low:
                raise SourceFailed(source, "permission", f"needs CAP_NET_ADMIN: {err}")
            raise SourceFailed(source, "tool", f"exited {res.returncode}: {err}")
        try:
            listing = parse_ipvsadm(res.stdout, source)
        except LvsParseError as e:
            raise SourceFailed(source, "parse", str(e)) from None
        if listing.kind != expect:
            raise SourceFailed(source, "parse", f"expected a --{expect} listing, got --{listing.kind} columns "
                                                "(ipvsadm prints only one of them; use two commands)")
        return listing

    # -- metrics ----------------------------------------------------------------------------

    def _service_metrics(self, services: list[Service] | None, stats: IpvsadmListing | None,
                         rates: IpvsadmListing | None, now: float, ts: float) -> list[Metric]:
        info = {s.key: s for s in services or []}
        counters = _by_key(stats)
        estimates = _by_key(rates)
        keys = list(dict.fromkeys([*info, *(k for k, r in counters if r is None),
                                   *(k for k, r in estimates if r is None)]))
        out: list[Metric] = []
        host = self.config.host
        for key in keys:
            svc = info.get(key)
            tags = {"host": host, "service": key.label, **_service_tags(key)}
            fields: dict[str, int | float | str] = {}
            if svc is not None:
                tags["sched"] = svc.scheduler
                fields.update(active_connections=sum(r.active for r in svc.reals),
                              inactive_connections=sum(r.inactive for r in svc.reals),
                              real_servers=len(svc.reals), weight_total=sum(r.weight for r in svc.reals))
                if svc.persistent_timeout is not None:
                    # /proc's timeout is in kernel ticks (seconds * HZ): reported as seconds it was 100-1000x off
                    fields.update(persistent=1, persistent_timeout_ticks=svc.persistent_timeout)
            self._add_counters(fields, ("svc", key), counters.get((key, None)), now)
            fields.update(estimates.get((key, None), {}))
            if fields:
                out.append(metric("ipvs_virtual_server", fields, tags, ts))

            reals = list(dict.fromkeys([*(r.key for r in (svc.reals if svc else [])),
                                        *(r for k, r in counters if k == key and r is not None),
                                        *(r for k, r in estimates if k == key and r is not None)]))
            by_real = {r.key: r for r in (svc.reals if svc else [])}
            for rkey in reals:
                rtags = {"host": host, "service": key.label, "address": rkey.address, "port": str(rkey.port),
                         "address_family": rkey.family, **_virtual_tags(key)}
                rfields: dict[str, int | float | str] = {}
                real = by_real.get(rkey)
                if real is not None:
                    rfields.update(weight=real.weight, forward=real.forward,
                                   active_connections=real.active, inactive_connections=real.inactive)
                self._add_counters(rfields, ("real", key, rkey), counters.get((key, rkey)), now)
                rfields.update(estimates.get((key, rkey), {}))
                if rfields:
                    out.append(metric("ipvs_real_server", rfields, rtags, ts))
        return out

    def _totals_metric(self, totals: dict[str, int], now: float, ts: float) -> Metric:
        fields: dict[str, int | float | str] = {n: totals[n] for n in RATE_FIELDS}
        self._add_counters(fields, ("totals",), {n: totals[n] for n in STAT_FIELDS}, now)
        return metric("ipvs_totals", fields, {"host": self.config.host}, ts)

    def _add_counters(self, fields: dict, key: tuple, values: dict[str, int] | None, now: float) -> None:
        if values is None:
            return
        fields.update(values)
        rates: Rates | None = self._tracker.update(key, values, now)
        if rates is not None:
            fields.update({f"{n}_rate": round(v, 6) for n, v in rates.per_second.items()})
            fields["counter_reset"] = int(rates.reset)


def _by_key(listing: IpvsadmListing | None) -> dict[tuple[ServiceKey, RealKey | None], dict[str, int]]:
    return {(row.service, row.real): row.values for row in listing.rows} if listing else {}


def _service_tags(key: ServiceKey) -> dict[str, str]:
    if key.protocol == "fwm":
        return {"fwmark": str(key.fwmark), "address_family": key.family}
    return {"address": key.address, "port": str(key.port), "protocol": key.protocol, "address_family": key.family}


def _virtual_tags(key: ServiceKey) -> dict[str, str]:
    if key.protocol == "fwm":
        return {"virtual_fwmark": str(key.fwmark)}
    return {"virtual_address": key.address, "virtual_port": str(key.port), "virtual_protocol": key.protocol}
