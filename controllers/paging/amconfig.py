"""Render alerts/alertmanager.yml with other receivers' URLs (tests, a local stack, staging).

The committed file is the production configuration; this changes only where notifications go
(and, for tests, the timings), so tests exercise the same routes, inhibitions and mute times:

    text = render_alertmanager_config(webhook_url="http://127.0.0.1:8099", routing_key_file=key_path)

Every webhook receiver posts to ``{webhook_url}/{receiver}`` and PagerDuty Events v2 to
``{webhook_url}/pagerduty`` unless ``pagerduty_url`` is given.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from opsloop.paths import shipped, write_private
from opsloop.validation import YamlFileError, read_yaml

ALERTS_DIR = shipped("alerts")   # the checkout's alerts/, or the copy inside the installed package
DEFAULT_SOURCE = ALERTS_DIR / "alertmanager.yml"
TIMING_KEYS = ("group_wait", "group_interval", "repeat_interval")


def load_alertmanager_config(source: Path = DEFAULT_SOURCE) -> dict[str, Any]:
    try:   # the shared reader: one line for a file that is not UTF-8 or not YAML, its alias and size bounds
        doc = read_yaml(source)
    except YamlFileError as e:
        raise ValueError(f"{source}: {e}") from None
    if not isinstance(doc, dict) or "route" not in doc or "receivers" not in doc:
        raise ValueError(f"{source}: not an Alertmanager configuration (no route/receivers)")
    return doc


def render_alertmanager_config(*, webhook_url: str, routing_key_file: Path | str,
                               pagerduty_url: str | None = None, timings: dict[str, str] | None = None,
                               time_intervals: list[dict[str, Any]] | None = None,
                               source: Path = DEFAULT_SOURCE) -> str:
    """The config at ``source`` with receivers pointed at ``webhook_url``; returns YAML text.

    ``timings`` overrides group_wait/group_interval/repeat_interval on every route (tests use
    seconds instead of minutes); ``time_intervals`` replaces the named mute intervals.
    """
    if not webhook_url.startswith(("http://", "https://")):
        raise ValueError(f"webhook_url {webhook_url!r} must start with http:// or https://")
    bad = set(timings or {}) - set(TIMING_KEYS)
    if bad:
        raise ValueError(f"timings: unknown keys {sorted(bad)} (allowed: {', '.join(TIMING_KEYS)})")
    doc = copy.deepcopy(load_alertmanager_config(source))
    base = webhook_url.rstrip("/")
    for receiver in doc["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{base}/{receiver['name']}"
        for pd in receiver.get("pagerduty_configs", []):
            pd["url"] = pagerduty_url or f"{base}/pagerduty"
            pd["routing_key_file"] = str(routing_key_file)
    if pagerduty_url:
        doc.setdefault("global", {})["pagerduty_url"] = pagerduty_url
    # Templates relative to the source file, made absolute: the rendered file lives elsewhere.
    doc["templates"] = [str((source.parent / t).resolve()) if not Path(t).is_absolute() else t
                        for t in doc.get("templates", [])]
    if timings:
        _set_timings(doc["route"], timings)
    if time_intervals is not None:
        known = {ti["name"] for ti in doc.get("time_intervals", [])}
        missing = known - {ti.get("name") for ti in time_intervals}
        if missing:
            raise ValueError(f"time_intervals: routes use {sorted(missing)}; give every one of them")
        doc["time_intervals"] = time_intervals
    return yaml.safe_dump(doc, sort_keys=False)


def _set_timings(route: dict[str, Any], timings: dict[str, str]) -> None:
    route.update(timings)
    for child in route.get("routes", []):
        _set_timings(child, timings)


def write_alertmanager_config(path: Path, **kwargs: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, render_alertmanager_config(**kwargs))
    return path
