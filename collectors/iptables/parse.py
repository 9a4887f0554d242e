"""Parser for ``iptables-save`` output (legacy and nft backends print the same format).

The grammar we accept is what iptables-save emits and iptables-restore reads::

    # comment
    *filter
    :INPUT ACCEPT [0:0]          built-in chain: policy and counters
    :my-chain - [0:0]            user chain
    [5:300] -A INPUT -j my-chain counters only with ``-c``
    COMMIT

Anything else is a :class:`RulesetParseError` naming the line. A table without ``COMMIT`` is an
error too: that is what truncated output (a killed iptables-save) looks like, and a truncated
ruleset must never read as "these chains are missing".
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

_COUNTERS = re.compile(r"^\[\d+:\d+\]$")
_CHAIN_NAME = re.compile(r"^[^\s!]{1,64}$")
_TABLE_NAME = re.compile(r"^[a-z]{1,32}$")
BUILTIN_POLICIES = frozenset({"ACCEPT", "DROP", "RETURN", "QUEUE"})
_QUOTING = re.compile(r"[\"'\\]")
_UNQUOTED_TOKEN = re.compile(r"[^ \t\r\n]+")   # shlex's whitespace


class RulesetParseError(ValueError):
    """iptables-save output that does not follow its grammar. Names the line number and text."""

    def __init__(self, line_no: int, line: str, reason: str) -> None:
        shown = line if len(line) <= 120 else line[:117] + "..."
        super().__init__(f"line {line_no}: {reason}: {shown!r}")
        self.line_no = line_no
        self.reason = reason


@dataclass(frozen=True, slots=True)
class DeviceMatch:
    """A ``--physdev-in``/``--physdev-out`` condition (``!`` negates it, a trailing ``+`` is a prefix)."""

    name: str
    negated: bool = False

    def matches(self, device: str) -> bool:
        hit = device.startswith(self.name[:-1]) if self.name.endswith("+") else device == self.name
        return hit != self.negated


@dataclass(frozen=True, slots=True)
class Rule:
    table: str
    chain: str
    conditions: tuple[str, ...]  # match tokens before -j/-g, without the comment match
    target: str | None           # -j/-g target; None for a counting rule
    goto: bool
    target_args: tuple[str, ...]
    physdev_in: DeviceMatch | None
    physdev_out: DeviceMatch | None
    normalized: str              # the rule without counters and comments (for fingerprints)

    @property
    def unconditional(self) -> bool:
        return not self.conditions


@dataclass(slots=True)
class Chain:
    name: str
    policy: str | None  # None for user chains ("-")
    rules: list[Rule] = field(default_factory=list)


@dataclass(slots=True)
class Table:
    name: str
    chains: dict[str, Chain] = field(default_factory=dict)


@dataclass(slots=True)
class Ruleset:
    tables: dict[str, Table] = field(default_factory=dict)
    # table -> chain -> the chains with a rule jumping to it; built on first use (a parsed ruleset is not changed)
    _jumps: dict[str, dict[str, set[str]]] = field(default_factory=dict, repr=False, compare=False)

    def jumped_from(self, table: str) -> dict[str, set[str]]:
        """For each chain of ``table``: the chains holding a rule that jumps (or goes) to it."""
        found = self._jumps.get(table)
        if found is None:
            found = {}
            t = self.tables.get(table)
            for chain in t.chains.values() if t else ():
                for rule in chain.rules:
                    if rule.target:
                        found.setdefault(rule.target, set()).add(chain.name)
            self._jumps[table] = found
        return found

    @property
    def rule_count(self) -> int:
        return sum(len(c.rules) for t in self.tables.values() for c in t.chains.values())

    @property
    def chain_count(self) -> int:
        return sum(len(t.chains) for t in self.tables.values())

    @property
    def empty(self) -> bool:
        """True when nothing beyond empty built-in chains is configured."""
        return all(c.policy is not None and not c.rules and c.policy == "ACCEPT"
                   for t in self.tables.values() for c in t.chains.values())

    def chain(self, table: str, name: str) -> Chain | None:
        t = self.tables.get(table)
        return t.chains.get(name) if t else None


def parse_ruleset(text: str) -> Ruleset:
    """Parse iptables-save output into tables, chains and rules."""
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    ruleset = Ruleset()
    table: Table | None = None
    table_line = 0
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "\x00" in line:
            raise RulesetParseError(line_no, raw, "NUL byte in output")
        if line.startswith("*"):
            if table is not None:
                raise RulesetParseError(line_no, raw, f"table {table.name!r} (line {table_line}) has no COMMIT")
            name = line[1:]
            if not _TABLE_NAME.match(name):
                raise RulesetParseError(line_no, raw, "bad table name")
            if name in ruleset.tables:
                raise RulesetParseError(line_no, raw, f"table {name!r} appears twice")
            table, table_line = Table(name), line_no
            ruleset.tables[name] = table
        elif line == "COMMIT":
            if table is None:
                raise RulesetParseError(line_no, raw, "COMMIT outside a table")
            table = None
        elif line.startswith(":"):
            if table is None:
                raise RulesetParseError(line_no, raw, "chain declaration outside a table")
            _declare_chain(table, line, line_no, raw)
        elif line.startswith("[") or line.startswith("-"):
            if table is None:
                raise RulesetParseError(line_no, raw, "rule outside a table")
            rule = _parse_rule(table.name, line, line_no, raw)
            chain = table.chains.get(rule.chain)
            if chain is None:
                raise RulesetParseError(line_no, raw, f"rule for undeclared chain {rule.chain!r}")
            chain.rules.append(rule)
        else:
            raise RulesetParseError(line_no, raw, "not an iptables-save line")
    if table is not None:
        raise RulesetParseError(table_line, "*" + table.name, "table has no COMMIT (truncated output?)")
    return ruleset


def _declare_chain(table: Table, line: str, line_no: int, raw: str) -> None:
    parts = line[1:].split()
    if len(parts) not in (2, 3) or (len(parts) == 3 and not _COUNTERS.match(parts[2])):
        raise RulesetParseError(line_no, raw, "chain declaration is not ':NAME POLICY [p:b]'")
    name, policy = parts[0], parts[1]
    if not _CHAIN_NAME.match(name):
        raise RulesetParseError(line_no, raw, "bad chain name")
    if policy != "-" and policy not in BUILTIN_POLICIES:
        raise RulesetParseError(line_no, raw, f"unknown chain policy {policy!r}")
    if name in table.chains:
        raise RulesetParseError(line_no, raw, f"chain {name!r} declared twice")
    table.chains[name] = Chain(name, None if policy == "-" else policy)


def _parse_rule(table: str, line: str, line_no: int, raw: str) -> Rule:
    if _QUOTING.search(line) is None:
        tokens = _UNQUOTED_TOKEN.findall(line)   # what shlex gives for such a line, ~20x faster (100k rules)
    else:
        try:
            tokens = shlex.split(line, posix=True)
        except ValueError as e:
            raise RulesetParseError(line_no, raw, f"cannot split rule ({e})") from None
    if tokens and _COUNTERS.match(tokens[0]):
        tokens = tokens[1:]
    if len(tokens) < 2 or tokens[0] != "-A":
        raise RulesetParseError(line_no, raw, "rule does not start with '-A CHAIN'")
    chain = tokens[1]
    if not _CHAIN_NAME.match(chain):
        raise RulesetParseError(line_no, raw, "bad chain name")
    rest = tokens[2:]

    conditions: list[str] = []
    target: str | None = None
    goto = False
    target_args: list[str] = []
    physdev_in = physdev_out = None
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok in ("-j", "--jump", "-g", "--goto"):
            if i + 1 >= len(rest):
                raise RulesetParseError(line_no, raw, f"{tok} without a target")
            target, goto = rest[i + 1], tok in ("-g", "--goto")
            target_args = rest[i + 2:]
            break
        if tok == "-m" and i + 1 < len(rest) and rest[i + 1] == "comment":
            i = _skip_comment(rest, i + 2)
            continue
        negated = tok == "!" and i + 1 < len(rest) and rest[i + 1] in ("--physdev-in", "--physdev-out")
        opt = rest[i + 1] if negated else tok
        if opt in ("--physdev-in", "--physdev-out"):
            j = i + (2 if negated else 1)
            if j >= len(rest):
                raise RulesetParseError(line_no, raw, f"{opt} without a device")
            match = DeviceMatch(rest[j], negated)
            if opt == "--physdev-in":
                physdev_in = match
            else:
                physdev_out = match
            conditions.extend(rest[i:j + 1])
            i = j + 1
            continue
        conditions.append(tok)
        i += 1
    normalized = " ".join(shlex.quote(t) for t in ["-A", chain, *conditions,
                                                    *(["-g" if goto else "-j", target] if target else []),
                                                    *target_args])
    return Rule(table, chain, tuple(conditions), target, goto, tuple(target_args),
                physdev_in, physdev_out, normalized)


def _skip_comment(tokens: list[str], i: int) -> int:
    """Skip ``--comment TEXT`` after ``-m comment`` (the text is one shlex token)."""
    if i < len(tokens) and tokens[i] == "--comment":
        return min(i + 2, len(tokens))
    return i
