"""Reads HAProxy's ``show stat`` from each configured admin socket and emits one sample per row."""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

from opsloop.collect import CollectError, Round
from opsloop.lb.haproxy import HaproxyAPI, HaproxyError, StatParseError, parse_show_stat_rows, reply_torn
from opsloop.records import Metric, metric
from opsloop.validation import WireError

# `type` column of show stat.
ROW_TYPES = {"0": "frontend", "1": "backend", "2": "server", "3": "listener"}
# Columns kept as strings (the rest are numbers, or empty when not applicable to the row).
STRING_FIELDS = ("status", "check_status", "mode", "agent_status", "last_chk", "last_agt", "addr", "cookie", "algo")
SKIP_FIELDS = ("pxname", "svname", "type", "sid", "iid", "pid", "tracked", "srv_icur", "srv_ilim")


def row_to_metric(row: dict[str, str], lb: str, timestamp: float) -> Metric:
    """Telegraf inputs.haproxy shape: measurement ``haproxy``, tags proxy/sv/type, counters as fields."""
    fields: dict[str, float | int | str] = {}
    for k, v in row.items():
        if k in SKIP_FIELDS or v == "":
            continue
        if k in STRING_FIELDS:
            fields[k] = v
            continue
        try:
            fields[k] = int(v)
        except ValueError:
            try:
                x = float(v)
            except ValueError:
                fields[k] = v
                continue
            # float() reads "nan", "inf" and "1e999" (overflow): no counter HAProxy keeps is any of them.
            if not math.isfinite(x):
                raise WireError(f"fields.{k}: {v[:40]!r} is not a finite number")
            fields[k] = x
    tags = {"host": lb, "proxy": row.get("pxname", ""), "sv": row.get("svname", ""),
            "type": ROW_TYPES.get(row.get("type", ""), "unknown")}
    return metric("haproxy", fields, tags, timestamp)


class HaproxyCollector:
    name = "haproxy"

    def __init__(self, instances: dict[str, str], timeout_s: float = 2.0, proxies: list[str] | None = None) -> None:
        self.instances = instances  # lb name -> admin socket path
        self.timeout_s = timeout_s
        self.proxies = set(proxies or [])

    def _read(self, lb: str, path: str) -> tuple[list[Metric], CollectError | None]:
        try:
            text = HaproxyAPI(path, self.timeout_s).show_stat()
            ts = time.time()
            rows, bad = parse_show_stat_rows(text)
        except HaproxyError as e:
            return [], CollectError(lb, "unreachable", str(e))
        except StatParseError as e:
            return [], CollectError(lb, "parse", str(e))
        out: list[Metric] = []
        for row in rows:
            if self.proxies and row.get("pxname") not in self.proxies:
                continue
            try:
                out.append(row_to_metric(row, lb, ts))
            except WireError as e:
                # One bad row costs that row only; the rows after it are still good samples.
                bad.append(f"row {row.get('pxname')}/{row.get('svname')}: {e}")
        if reply_torn(text):   # the tear is bad[0] (it says what was kept), then the rows refused besides
            rest = f"; {len(bad) - 1} row(s) refused besides, first: {bad[1]}" if len(bad) > 1 else ""
            return out, CollectError(lb, "parse", bad[0] + rest)
        if bad:
            return out, CollectError(lb, "parse", f"{len(bad)} show stat row(s) refused; first: {bad[0]}")
        return out, None

    def collect(self) -> Round:
        rnd = Round()
        with ThreadPoolExecutor(max_workers=min(8, max(1, len(self.instances)))) as pool:
            for metrics, err in pool.map(lambda kv: self._read(*kv), self.instances.items()):
                rnd.metrics.extend(metrics)
                if err is not None:
                    rnd.errors.append(err)
        return rnd
