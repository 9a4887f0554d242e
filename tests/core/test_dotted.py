"""The one dotted-path reader the config loader and the log search share."""

from __future__ import annotations

from opsloop.dotted import get_dotted


def test_nested_path_and_missing_steps() -> None:
    doc = {"controllers": {"edge": {"interval_s": 5}}, "kafka": "not a mapping"}
    assert get_dotted(doc, "controllers.edge") == {"interval_s": 5}
    assert get_dotted(doc, "controllers.edge.interval_s") == 5
    assert get_dotted(doc, "controllers.paging") is None
    assert get_dotted(doc, "kafka.bootstrap_servers") is None  # a step that is not a mapping


def test_a_flat_dotted_key_only_when_asked() -> None:
    doc = {"systemd.unit": "opsloop-edge.service", "systemd": {"unit": "nested.service"}}
    assert get_dotted(doc, "systemd.unit", flat_key=True) == "opsloop-edge.service"
    assert get_dotted(doc, "systemd.unit") == "nested.service"  # config sections are never flat keys
    assert get_dotted({"opsloop": {"level": "warning"}}, "opsloop.level", flat_key=True) == "warning"
