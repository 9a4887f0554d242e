"""Every runbook link an on-call engineer can click resolves to a file and an anchor in docs/runbooks.

Links come from two places: the alert rules' ``runbook_url`` annotations and the findings'
``runbook`` field (which the paging actuator sends as ``runbook_url``). The finding types are read
from the detectors' source, so a new detector without a runbook section fails here. The rendering
step that swaps in a deployment's base URLs is checked with the real promtool.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from opsloop.controllers.edge.base import Decision
from opsloop.controllers.edge.findings import decision_findings
from opsloop.records import Mode
from opsloop.controllers.paging.mapping import Links, annotations_for
from opsloop import runbooks
from opsloop.records import Finding, Severity
from opsloop.runbooks import (DEFAULT_DASHBOARD_BASE_URL, DEFAULT_RUNBOOK_BASE_URL, FINDING_RUNBOOKS,
                              finding_runbook_url, render_rules)
from opsloop.streams.detectors.findingbook import FindingBook
from tests.helpers import REPO

RUNBOOKS = REPO / "docs" / "runbooks"
RULE_FILES = sorted((REPO / "alerts" / "rules").glob("*.yml"))
# Where findings are raised: the stream detectors, the edge decision, the weight actuators.
FINDING_SOURCES = [*sorted((REPO / "streams" / "detectors").rglob("*.py")),
                   REPO / "controllers" / "edge" / "findings.py", REPO / "controllers" / "actuators" / "service.py"]
FAMILIES = ("firewall", "power", "netperf", "keystone", "edge", "anomaly")


def anchors(page: Path) -> set[str]:
    return set(re.findall(r'<a id="([^"]+)"></a>', page.read_text()))


def resolve(url: str, base: str = DEFAULT_RUNBOOK_BASE_URL) -> tuple[Path, str]:
    """The file and anchor a runbook URL points to; fails when either does not exist."""
    assert url.startswith(base + "/"), f"{url} is not under the runbook base {base}"
    path, _, anchor = url[len(base) + 1:].partition("#")
    page = RUNBOOKS / path
    assert page.is_file(), f"{url}: {page.relative_to(REPO)} does not exist"
    assert anchor, f"{url}: no anchor"
    assert anchor in anchors(page), f"{url}: no <a id=\"{anchor}\"> in {page.relative_to(REPO)}"
    return page, anchor


def alert_rules(files: list[Path] = RULE_FILES) -> list[dict]:
    return [r for f in files for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r]


def detector_names() -> set[str]:
    """String constants '<family>.<name>' in the sources that raise findings (module constants and
    detector= keywords), as the code spells them."""
    names: set[str] = set()
    pattern = re.compile(rf"^(?:{'|'.join(FAMILIES)})\.[a-z][a-z0-9_]*$")
    for src in FINDING_SOURCES:
        for node in ast.walk(ast.parse(src.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.match(node.value):
                names.add(node.value)
    return names


# -- alert rules -----------------------------------------------------------------------------------
def test_every_alert_rule_links_to_an_existing_runbook_section() -> None:
    rules = alert_rules()
    assert len(rules) >= 30
    for r in rules:
        page, anchor = resolve(r["annotations"]["runbook_url"])
        # the section is about this alert: its name appears right after the anchor
        text = page.read_text()
        section = text[text.index(f'<a id="{anchor}"></a>'):][:400]
        assert r["alert"] in section, f"{r['alert']}: section #{anchor} of {page.name} does not name it"


def test_no_placeholder_link_is_left() -> None:
    for f in [*RULE_FILES, *sorted((REPO / "alerts" / "tests").glob("*.yml")), REPO / "alerts" / "alertmanager.yml",
              *sorted((REPO / "alerts" / "templates").glob("*"))]:
        text = f.read_text()
        assert "runbooks.example" not in text and "grafana.example" not in text, f.name


# -- findings ----------------------------------------------------------------------------------------
def test_the_detectors_in_the_code_are_the_ones_with_runbooks() -> None:
    found = detector_names()
    # sanity: the scan sees the detectors of every family
    assert {"firewall.unprotected_port", "power.generation_deviation", "netperf.throughput_drop",
            "keystone.heavy_hitter", "edge.capacity_shortfall", "edge.fail_static"} <= found
    missing = found - set(FINDING_RUNBOOKS)
    assert not missing, f"finding types without a runbook section (add them to FINDING_RUNBOOKS): {sorted(missing)}"
    stale = set(FINDING_RUNBOOKS) - found
    assert not stale, f"runbook entries for finding types no code raises: {sorted(stale)}"


@pytest.mark.parametrize("detector", [*sorted(FINDING_RUNBOOKS), "anomaly.ipmi_power.watts", "new.detector"])
def test_every_finding_type_links_to_an_existing_runbook_section(detector: str) -> None:
    f = Finding(detector=detector, what="w", first_seen=1.0, last_seen=1.0)
    assert f.runbook == finding_runbook_url(detector)
    page, anchor = resolve(f.runbook)
    if detector in FINDING_RUNBOOKS:
        text = page.read_text()
        assert f"`{detector}`" in text[text.index(f'<a id="{anchor}"></a>'):][:300], detector
    # the same link survives the topic and becomes the page's runbook_url
    again = Finding.decode(f.encode())
    assert again.runbook == f.runbook
    assert annotations_for(again, Links())["runbook_url"] == f.runbook


def test_findings_raised_by_the_real_code_carry_resolvable_links() -> None:
    # stream detectors go through the finding book (it used to hand out a runbook site per detector name)
    book = FindingBook()
    f = book.raise_(detector="firewall.unprotected_port", what="VM port without its security-group chain",
                    where={"hypervisor": "hv-1", "port": "p1"}, observed="absent", expected="present", score=1.0,
                    severity=Severity.CRITICAL, explanation="", now=100.0, runbook="runbooks/firewall.md")
    assert resolve(f.runbook)[1] == "firewall-unprotected-port"
    # the edge decision names a README as its runbook; the finding carries the section instead
    w = np.array([[0.5, 0.5]])
    shed = Decision(weights=w, target=w, mode=Mode.SHED, reason="capacity short", version=3, changed=True,
                    demand_estimate=np.array([100.0]), shed_rps=np.array([30.0]))
    held = Decision(weights=w, target=w, mode=Mode.HOLD, reason="inputs 95s old > stale_after_s 30", version=4,
                    changed=False, demand_estimate=np.array([100.0]), shed_rps=np.zeros(1), inputs_age_s=95.0,
                    stale=True)
    got = {x.detector: x for d in (shed, held) for x in decision_findings(d, "web", ["ams1"], now=100.0)}
    assert set(got) == {"edge.capacity_shortfall", "edge.weights_held"}
    assert resolve(got["edge.capacity_shortfall"].runbook)[1] == "edge-capacity-shortfall"
    assert resolve(got["edge.weights_held"].runbook)[1] == "edge-weights-held"


def test_an_absolute_runbook_given_by_a_detector_is_kept() -> None:
    f = Finding(detector="power.cost", what="w", first_seen=1.0, last_seen=1.0, runbook="https://wiki.corp/power")
    assert f.runbook == "https://wiki.corp/power"


def test_the_base_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runbooks.RUNBOOK_BASE_ENV, "https://git.corp/opsloop/-/blob/main/docs/runbooks/")
    f = Finding(detector="edge.fail_static", what="w", first_seen=1.0, last_seen=1.0)
    assert f.runbook == "https://git.corp/opsloop/-/blob/main/docs/runbooks/edge.md#edge-fail-static"
    resolve(f.runbook, base="https://git.corp/opsloop/-/blob/main/docs/runbooks")


def test_a_bad_base_url_in_the_environment_never_breaks_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runbooks.RUNBOOK_BASE_ENV, "runbooks.corp/opsloop")   # no scheme
    f = Finding(detector="edge.fail_static", what="w", first_seen=1.0, last_seen=1.0)
    resolve(f.runbook)                                                       # the default base, not a crash
    with pytest.raises(ValueError, match="runbooks.corp/opsloop"):
        runbooks.runbook_base_url("runbooks.corp/opsloop")                  # an explicit value is checked


# -- links inside the runbooks -----------------------------------------------------------------------
def test_links_between_runbook_pages_resolve() -> None:
    pages = sorted(RUNBOOKS.glob("*.md"))
    assert len(pages) >= 8
    n = 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            dest = RUNBOOKS / path if path else page
            assert dest.is_file(), f"{page.name}: link to missing {target}"
            if anchor:
                assert anchor in anchors(dest), f"{page.name}: link to missing anchor {target}"
            n += 1
    assert n >= 10


def test_every_runbook_section_says_what_to_check() -> None:
    for page in sorted(RUNBOOKS.glob("*.md")):
        if page.name == "README.md":
            continue
        text = page.read_text()
        sections = re.split(r'<a id="[^"]+"></a>', text)[1:]
        assert sections, page.name
        for s in sections:
            head = s.strip().splitlines()[0]
            backstop = "Backstop rule" in s and "](#" in s        # points to the finding's section
            assert "**Meaning.**" in s, (page.name, head)
            assert backstop or "Check first" in s, (page.name, head)


# -- rendering with a deployment's base URLs ------------------------------------------------------------
@pytest.mark.integration
def test_rendered_rules_use_the_deployment_bases_and_pass_promtool(tmp_path: Path) -> None:
    rb, db = "https://git.corp/opsloop/-/blob/main/docs/runbooks", "https://grafana.corp"
    r = subprocess.run([sys.executable, "-m", "opsloop.runbooks", "render-rules", "--out", str(tmp_path / "rules"),
                        "--runbook-base-url", rb, "--dashboard-base-url", db, *map(str, RULE_FILES)],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    rendered = sorted((tmp_path / "rules").glob("*.yml"))
    assert [p.name for p in rendered] == [p.name for p in RULE_FILES]
    check = subprocess.run(["promtool", "check", "rules", *map(str, rendered)], capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    before, after = alert_rules(), alert_rules(rendered)
    assert len(before) == len(after)
    for old, new in zip(before, after):
        assert new["annotations"]["runbook_url"] == old["annotations"]["runbook_url"].replace(DEFAULT_RUNBOOK_BASE_URL, rb)
        assert new["annotations"]["dashboard_url"] == old["annotations"]["dashboard_url"].replace(
            DEFAULT_DASHBOARD_BASE_URL, db)
        resolve(new["annotations"]["runbook_url"], base=rb)
        # nothing else changed
        assert {k: v for k, v in new.items() if k != "annotations"} == {k: v for k, v in old.items() if k != "annotations"}
        assert {k: v for k, v in new["annotations"].items() if not k.endswith("_url")} == \
               {k: v for k, v in old["annotations"].items() if not k.endswith("_url")}


def test_render_rejects_a_base_that_is_not_a_url(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "opsloop.runbooks", "render-rules", "--out", str(tmp_path),
                        "--runbook-base-url", "git.corp/runbooks", str(RULE_FILES[0])],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and "git.corp/runbooks" in r.stderr and not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="ftp://x"):
        render_rules("", "ftp://x", DEFAULT_DASHBOARD_BASE_URL)


def test_help_has_examples() -> None:
    r = subprocess.run([sys.executable, "-m", "opsloop.runbooks", "--help"], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert r.returncode == 0 and "render-rules" in r.stdout and "examples:" in r.stdout
