"""What writes to the journal and what ships from it agree: every opsloop systemd unit (deploy/systemd) and
every opsloop container (docker-compose's journald driver) logs under an identifier both shipped Beats
configs match, and the two configs are the same pipeline.

The journal's matches are exact (no wildcards): a unit logging as ``opsloop-edge`` is not shipped by a
match on ``opsloop``. The shippers themselves run in test_logs_journald.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.helpers import REPO
from tests.core.audit.beats import COMPOSE_DIR, UNITS_DIR, syslog_identifier


def _input(beat: str) -> dict[str, Any]:
    doc = yaml.safe_load((COMPOSE_DIR / f"{beat}.yml").read_text())
    inputs = doc[f"{beat}.inputs"]
    assert len(inputs) == 1
    return dict(inputs[0])


def _identifiers_matched(beat: str) -> set[str]:
    matches = _input(beat)["include_matches"]
    assert isinstance(matches, list), f"{beat}.yml: include_matches must be a list on 7.x (a mapping is ignored)"
    return {m.split("=", 1)[1] for m in matches if m.startswith("SYSLOG_IDENTIFIER=")}


@pytest.mark.parametrize("beat", ["filebeat", "journalbeat"])
def test_every_unit_logs_under_an_identifier_the_shipper_matches(beat: str) -> None:
    units = sorted(UNITS_DIR.glob("*.service"))
    assert len(units) >= 5
    matched = _identifiers_matched(beat)
    for unit in units:
        assert syslog_identifier(unit) in matched, f"{unit.name} logs as {syslog_identifier(unit)!r}; {beat}.yml " \
                                                   f"ships only {sorted(matched)}"


@pytest.mark.parametrize("beat", ["filebeat", "journalbeat"])
def test_every_opsloop_container_logs_under_an_identifier_the_shipper_matches(beat: str) -> None:
    compose = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
    built = {name: s for name, s in compose["services"].items() if "build" in s}
    assert built
    for name, svc in built.items():
        # Docker's journald driver writes the tag as SYSLOG_IDENTIFIER.
        assert svc["logging"]["driver"] == "journald", name
        assert svc["logging"]["options"]["tag"] in _identifiers_matched(beat), name


@pytest.mark.parametrize("beat", ["filebeat", "journalbeat"])
def test_the_shipper_resumes_from_its_cursor(beat: str) -> None:
    """`seek: tail` ignores the stored cursor (lines written while the shipper was down are lost)."""
    inp = _input(beat)
    assert inp["seek"] == "cursor" and inp["cursor_seek_fallback"] == "tail"


def test_filebeat_and_journalbeat_are_the_same_pipeline() -> None:
    fb = yaml.safe_load((COMPOSE_DIR / "filebeat.yml").read_text())
    jb = yaml.safe_load((COMPOSE_DIR / "journalbeat.yml").read_text())
    fb_in, jb_in = _input("filebeat"), _input("journalbeat")
    for key in ("include_matches", "seek", "cursor_seek_fallback", "processors"):
        assert fb_in[key] == jb_in[key], key
    for key in ("setup.ilm.enabled", "setup.template.type", "setup.template.name", "setup.template.pattern",
                "setup.template.json.name", "output.elasticsearch"):
        assert fb[key] == jb[key], key
    assert jb["seccomp.enabled"] is False      # Journalbeat 7.15 cannot start its threads otherwise


def test_the_compose_stack_runs_the_filebeat_release_the_tests_run() -> None:
    """filebeat.yml uses 7.17 syntax (a list of matches); 8.x reads it differently."""
    script = (REPO / "setup.d" / "80-beats.sh").read_text()
    built = re.search(r"^FILEBEAT_VERSION=(\S+)$", script, re.M)
    assert built
    compose = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
    assert compose["services"]["filebeat"]["image"] == f"docker.elastic.co/beats/filebeat:{built.group(1)}"
