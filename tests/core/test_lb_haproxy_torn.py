"""``show stat`` cut between two rows: HAProxy's recorded reply served over a unix socket, cut at each row
boundary. HAProxy ends every answer with an empty line; without it the reply is torn, never a smaller round."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from opsloop.lb.haproxy import HaproxyAPI, StatParseError, parse_show_stat, parse_show_stat_rows
from tests.collectors.haproxy.cut_reply import CutReply, after_header, after_row
from tests.helpers import REPO

RECORDED = (REPO / "collectors" / "haproxy" / "testdata" / "show_stat_haproxy26.csv").read_text()


def test_the_recorded_reply_ends_as_haproxy_ends_every_answer() -> None:
    # captured from HAProxy 2.6 (and checked live in tests/collectors/haproxy/test_torn_reply.py)
    assert RECORDED.endswith(",\n\n") and not RECORDED.endswith(",\n\n\n")
    with CutReply(recorded=RECORDED) as relay:
        text = HaproxyAPI(relay.path).show_stat()
    assert text == RECORDED
    assert [r["svname"] for r in parse_show_stat(text)] == ["FRONTEND", "near", "far", "BACKEND"]


@pytest.mark.parametrize("cut, kept", [
    (after_header, []),
    # fe_web has no BACKEND row: last in a torn reply, its end cannot be told
    (after_row("FRONTEND"), []),
    # be_web's servers after near never came: be_web is refused whole, fe_web before it is kept
    (after_row("near"), ["FRONTEND"]),
    (after_row("far"), ["FRONTEND"]),
    # every row there, only the end missing: nothing to refuse, still torn
    (after_row("BACKEND"), ["FRONTEND", "near", "far", "BACKEND"]),
], ids=["header", "FRONTEND", "near", "far", "BACKEND"])
def test_reply_cut_at_a_row_boundary_is_torn_and_keeps_only_whole_proxies(cut: Callable[[str], str],
                                                                          kept: list[str]) -> None:
    with CutReply(recorded=RECORDED) as relay:
        relay.cut = cut
        text = HaproxyAPI(relay.path).show_stat()
    assert text == cut(RECORDED)
    # the actuator's read-back: an error, never fewer servers
    with pytest.raises(StatParseError, match="^show stat reply torn: .* without HAProxy's end-of-answer"):
        parse_show_stat(text)
    rows, errors = parse_show_stat_rows(text)
    assert [r["svname"] for r in rows] == kept
    [error] = errors
    assert error.startswith("show stat reply torn") and f"{len(kept)} row(s) of whole proxies kept" in error
    # with its end, the same rows are a whole round
    assert parse_show_stat_rows(text + "\n") == (parse_show_stat(text + "\n"), [])

def test_torn_before_or_inside_the_header_is_a_torn_error() -> None:
    with pytest.raises(StatParseError, match="^show stat reply torn: 0 bytes .*: show stat output does not start"):
        parse_show_stat_rows("")
    rows, [error] = parse_show_stat_rows(RECORDED[:40])
    assert rows == [] and error.startswith("show stat reply torn: 40 bytes")

def test_torn_mid_row_refuses_the_open_proxy_too() -> None:
    # cut inside the BACKEND row (stot 121 -> 12): refused by its width, near and far with it (be_web unclosed)
    text = RECORDED[:RECORDED.index("be_web,BACKEND,") + len("be_web,BACKEND,0,0,0,2,200,12")]
    rows, errors = parse_show_stat_rows(text)
    assert [r["svname"] for r in rows] == ["FRONTEND"]
    assert "the last proxy's 2 refused ('be_web': no BACKEND row)" in errors[0]
    assert "line 5 (be_web/BACKEND): 8 columns, expected 129" in errors[1]

