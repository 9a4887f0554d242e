"""A key whose stored state is refused at a restore clears the open findings that can still be read from it.

Every stateful handler (firewall, power, netperf, keystone, anomaly) builds its real state through the real agent
loop (``tests/streams/test_state_restore_fuzz.py``'s ``built``: good telemetry, ``StatefulAgent.run_batch``, the
table's codec); one key's state is then damaged outside its books (a time that is no time), so that
``DetectorHandler.restore`` refuses it. A fresh agent restores at its first batch (the other keys' rounds) and
publishes, through its findings sink, one ``cleared`` per open finding of the refused key: its id, its own
``first_seen`` and ``last_seen``, an explanation saying the state was unreadable. The real paging book
(``controllers/paging/book.py``) resolves the page with it, ignores the same clear from a second worker as
stale, and takes the new incident the fresh detector opens when the condition holds.

Before (old code): the refused key's open findings were forgotten with its state; the fresh detector did not
know them, so no clear was ever published and their pages stayed open (re-sent by the paging actuator) for good.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any, Iterator

import pytest

from opsloop.records import Finding, Severity
from opsloop.controllers.paging.book import PagingBook
from opsloop.streams.agents.stateful import StatefulAgent
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.power.handler import PowerHandler
from tests.streams.test_state_restore_fuzz import KINDS, STATE_CODEC, T0, Kind, Outcome, batch, built, logged, \
    new_agent, sim_clock, unreadable

HANDLER_KINDS = ["anomaly", "firewall", "keystone", "netperf", "power"]   # each handler once (KINDS: six)


def stored_books(name: str, state: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Where each handler keeps its books in its state, spelled out (not the code's walk of it)."""
    if name == "netperf":
        yield state["detector"]["book"]
    elif name == "keystone":
        yield from (r["book"] for r in state["regimes"].values())
        yield state["heavy"]["book"]
        yield state["p95"]["book"]
    else:
        yield state["book"]


def damage_outside_books(name: str, state: dict[str, Any]) -> dict[str, Any]:
    """The state with a time no restore takes, away from its books: refused, every finding intact."""
    out = copy.deepcopy(state)
    if name == "firewall":
        out["report"]["timestamp"] = "yesterday"
    else:
        out["last_ts"] = "yesterday"   # a number (power, anomaly) or an object of them (netperf, keystone)
    return out


def victim(name: str) -> tuple[Kind, dict[str, Any], str, str]:
    kind = KINDS[name]
    states, handler_name = built(name)
    key = kind.key(kind.sources[0])
    return kind, states, handler_name, key


def open_in(name: str, state: dict[str, Any]) -> dict[str, Finding]:
    found = [Finding.model_validate(doc) for book in stored_books(name, state) for doc in book["open"].values()]
    return {f.id: f for f in found}


def restore_with(name: str, damaged: Any, handler: Any = None) -> tuple[Outcome, StatefulAgent, list[dict[str, Any]]]:
    """A fresh agent on the built table with the victim's value ``damaged``, one batch of the other sources'
    next round (the restore comes first); (what it published, the agent, the state_restore_failed lines)."""
    kind, states, handler_name, key = victim(name)
    out, letters = Outcome(), []
    dict.update(out.table, copy.deepcopy(states))
    dict.__setitem__(out.table, f"{handler_name}|{key}", damaged)
    agent = new_agent(out.table, out, letters, handler or kind.make())
    others = [e for e in batch(kind, kind.warm) if e.message.key != kind.sources[0].encode()]
    with sim_clock(T0 + kind.step_s * (kind.warm + 1) + 60), logged() as log:
        asyncio.run(agent.run_batch(others))
    assert not letters, letters
    return out, agent, log.events("state_restore_failed")


def cleared(out: Outcome) -> dict[str, Finding]:
    return {f.id: f for e, f in out.published if e == "cleared"}


@pytest.mark.parametrize("name", HANDLER_KINDS)
def test_a_refused_keys_open_findings_are_cleared_with_their_own_stamps(name: str) -> None:
    kind, states, handler_name, key = victim(name)
    state = states[f"{handler_name}|{key}"]
    held = open_in(name, state)
    assert held, "the victim holds open findings"
    before = unreadable(handler_name)
    out, agent, refusals = restore_with(name, STATE_CODEC.loads(STATE_CODEC.dumps(damage_outside_books(name, state))))
    [refusal] = refusals
    assert refusal["key"] == key and refusal["findings_cleared"] == len(held) and refusal["findings_unreadable"] == 0
    assert unreadable(handler_name) == before + 1
    clears = cleared(out)
    assert set(clears) == set(held), (sorted(clears), sorted(held))
    for fid, f in clears.items():
        assert f.cleared and f.score == 0.0
        assert (f.first_seen, f.last_seen, f.where) == (held[fid].first_seen, held[fid].last_seen, held[fid].where)
        assert "unreadable" in f.explanation and "fresh samples" in f.explanation
    # the other keys' open findings were restored and are not cleared
    for other in kind.sources[1:]:
        other_state = states.get(f"{handler_name}|{kind.key(other)}")
        if other_state is not None:
            assert not set(open_in(name, other_state)) & set(clears)
    # published once: the next batch publishes no clear again
    n = len(out.published)
    with sim_clock(T0 + kind.step_s * (kind.warm + 2) + 60):
        asyncio.run(agent.run_batch([e for e in batch(kind, kind.warm + 1)
                                     if e.message.key != kind.sources[0].encode()]))
    assert not [f for e, f in out.published[n:] if e == "cleared" and f.id in held]


def test_the_state_as_written_clears_nothing() -> None:
    """A key restored (not refused) keeps its findings open: no clear."""
    for name in HANDLER_KINDS:
        _, states, handler_name, key = victim(name)
        out, _, refusals = restore_with(name, copy.deepcopy(states[f"{handler_name}|{key}"]))
        assert not refusals and not cleared(out), name


def test_a_damaged_finding_is_counted_and_the_readable_ones_are_cleared() -> None:
    """Of the victim's open findings, one with a severity no version writes and one about another hypervisor:
    neither is cleared (no finding to clear, or another key's to keep); the readable one is."""
    _, states, _, _ = victim("firewall")
    state = damage_outside_books("firewall", states["firewall-detector|hv-v"])
    entries = list(state["book"]["open"].values())
    assert len(entries) >= 3
    entries[0]["severity"] = "bogus-enum"
    entries[1]["where"]["hypervisor"] = "hv-o"
    out, _, [refusal] = restore_with("firewall", STATE_CODEC.loads(STATE_CODEC.dumps(state)))
    assert refusal["findings_cleared"] == len(entries) - 2 and refusal["findings_unreadable"] == 2
    ids = {Finding.model_validate(e).id for e in entries[2:]}
    assert set(cleared(out)) == ids


def test_a_state_that_is_no_json_is_refused_with_its_findings_not_countable() -> None:
    _, states, _, _ = victim("firewall")
    raw = STATE_CODEC.dumps(states["firewall-detector|hv-v"])
    out, _, [refusal] = restore_with("firewall", STATE_CODEC.loads(raw[:len(raw) // 2]))
    assert refusal["findings_cleared"] == 0 and refusal["findings_unreadable"] is None
    assert not cleared(out)


def test_the_paging_book_resolves_the_page_and_takes_the_new_incident() -> None:
    """The clear applies in the real paging book (its incident's ``first_seen``); the same clear from a second
    worker that refused the same key is stale; the fresh detector re-opens the port finding still unprotected,
    a new incident that pages again."""
    kind, states, _, _ = victim("firewall")
    state = states["firewall-detector|hv-v"]
    held = open_in("firewall", state)
    book, now = PagingBook(min_severity=Severity.INFO), T0 + 86_400
    for f in held.values():
        assert [a.kind for a in book.apply(f, now)] == ["open"]
    damaged = STATE_CODEC.loads(STATE_CODEC.dumps(damage_outside_books("firewall", state)))
    first, agent, _ = restore_with("firewall", damaged)
    second, _, _ = restore_with("firewall", damaged)   # another worker refusing the same key
    for fid, f in cleared(first).items():
        assert [a.kind for a in book.apply(f, now)] == ["resolve"], fid
    assert not book.open
    for f in cleared(second).values():
        [action] = book.apply(f, now)
        assert action.kind == "ignore" and "stale" in action.detail
    n = len(first.published)
    with sim_clock(T0 + kind.step_s * (kind.warm + 2) + 60):
        asyncio.run(agent.run_batch(batch(kind, kind.warm + 1)))   # hv-v's port still unprotected
    again = [f for e, f in first.published[n:] if e == "opened" and f.where.get("hypervisor") == "hv-v"]
    port = [f for f in again if f.detector == "firewall.unprotected_port"]
    assert port and port[0].id in held and port[0].first_seen > held[port[0].id].first_seen
    assert [a.kind for a in book.apply(port[0], now)] == ["open"]


def test_a_refused_keys_clear_leaves_another_handlers_and_keys_alone() -> None:
    """Two handlers in one agent: the firewall key refused clears its findings only; the power handler's
    restored findings stay open, none of its own is cleared."""
    f_states, _ = built("firewall")
    p_states, _ = built("power")
    out, letters = Outcome(), []
    table = out.table
    dict.update(table, copy.deepcopy(f_states))
    dict.update(table, copy.deepcopy(p_states))
    dict.__setitem__(table, "firewall-detector|hv-v", STATE_CODEC.loads(STATE_CODEC.dumps(
        damage_outside_books("firewall", f_states["firewall-detector|hv-v"]))))
    agent = new_agent(table, out, letters, FirewallHandler(), PowerHandler())
    kind = KINDS["power"]
    with sim_clock(T0 + 3600):
        asyncio.run(agent.run_batch(batch(kind, kind.warm)))
    assert not letters
    assert {f.where.get("hypervisor") for f in cleared(out).values()} == {"hv-v"}
    assert set(cleared(out)) == set(open_in("firewall", f_states["firewall-detector|hv-v"]))


def test_a_table_value_that_is_no_object_is_refused_without_a_clear() -> None:
    for value in (5, "x", [1, 2]):
        out, _, [refusal] = restore_with("power", value)
        assert refusal["findings_unreadable"] is None and not cleared(out)
