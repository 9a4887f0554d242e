"""The detector registry: every detector folder is registered, its settings section and handler follow it."""

from __future__ import annotations

import pytest

from opsloop.config import Settings
from opsloop.streams.agents.settings import DetectorsSettings, detectors_settings
from opsloop.streams.detectors.anomaly.settings import AnomalySettings
from opsloop.streams.detectors.registry import DETECTORS, detector_handlers
from tests.helpers import REPO

FOLDERS = sorted(p.parent.name for p in (REPO / "streams" / "detectors").glob("*/__init__.py"))


def test_every_detector_folder_is_registered_once() -> None:
    names = [d.name for d in DETECTORS]
    assert sorted(names) == FOLDERS   # a folder without its registry line fails here
    assert len(set(names)) == len(names)


def test_settings_sections_follow_the_registry_in_order() -> None:
    assert list(DetectorsSettings.model_fields) == ["refresh_s", *(d.name for d in DETECTORS)]
    for d in DETECTORS:
        assert isinstance(getattr(DetectorsSettings(), d.name), d.settings)


def test_unknown_detector_section_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"streams\.detectors\.dsik"):
        detectors_settings(Settings(streams={"detectors": {"dsik": {}}}))


def test_one_handler_per_enabled_detector_with_unique_state_names() -> None:
    handlers = detector_handlers(DetectorsSettings())
    assert len(handlers) == len(DETECTORS)
    assert len({h.name for h in handlers}) == len(handlers)   # the state table's key prefix
    off = DetectorsSettings.model_validate({d.name: {"enabled": False} for d in DETECTORS})
    assert detector_handlers(off) == []
    no_series = DetectorsSettings(anomaly=AnomalySettings(series=[]))
    assert "anomaly-detector" not in {h.name for h in detector_handlers(no_series)}


def test_handlers_give_their_detectors_a_book_with_their_refresh_interval() -> None:
    conf = DetectorsSettings(refresh_s=42.0)
    by_name = {h.name: h for h in detector_handlers(conf)}
    for name in ("firewall-detector", "power-detector"):
        assert by_name[name].detector.book.refresh_s == 42.0
    netperf = by_name["netperf-detector"]
    assert netperf._new_detector().book.refresh_s == 42.0
    keystone = by_name["keystone-detector"]
    st = keystone._host("ks-1")
    assert st.heavy.book.refresh_s == st.p95.book.refresh_s == 42.0
