"""Collector runtime: scheduling, publishing with an on-disk spool, and the collector contract."""

from opsloop.collect.types import CollectError, Collector, CollectorUnavailable, Round

__all__ = ["CollectError", "Collector", "CollectorUnavailable", "Round"]
