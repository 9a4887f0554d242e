"""Keystone load collector (signal 3): active token/S3-signature probes, uWSGI stats and access log,
and the S3 front end's nginx log (per-credential load, the source documents' small-request p95). See README.md."""

from __future__ import annotations

from .collector import KeystoneCollector
from .config import Config, FrontendConfig, ProbeConfig


def build(config: Config) -> KeystoneCollector:
    return KeystoneCollector(config)


__all__ = ["Config", "FrontendConfig", "ProbeConfig", "KeystoneCollector", "build"]
