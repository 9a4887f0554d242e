"""One round of the iptables state collector: every hypervisor's ruleset against its VM ports."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from opsloop.collect.types import CollectError, CollectorUnavailable, Round
from opsloop.records import Metric, metric
from opsloop.validation import WireError

from opsloop.collectors.iptables.analyze import PortStatus, analyze_port
from opsloop.collectors.iptables.config import Config, Target
from opsloop.collectors.iptables.fingerprint import fingerprint
from opsloop.collectors.iptables.parse import Ruleset, RulesetParseError, parse_ruleset
from opsloop.collectors.iptables.ports import PortsError, VmPort, parse_ports, read_ports_file
from opsloop.collectors.iptables.privilege import looks_like_permission_error, missing_network_capabilities
from opsloop.collect.tool import (ToolMissing, ToolNotExecutable, ToolOutputTooLarge, ToolResult, ToolTimeout,
                                  run_tool)
from opsloop.collectors.iptables.versions import UNKNOWN, dpkg_query_argv, parse_versions

SAVE_TOOLS = {("ipv4", "legacy"): "iptables-legacy-save", ("ipv4", "nft"): "iptables-nft-save",
              ("ipv6", "legacy"): "ip6tables-legacy-save", ("ipv6", "nft"): "ip6tables-nft-save"}
Source = tuple[str, str]   # (family, backend)
_ERR_PREVIEW = 200


class TargetFailed(Exception):
    def __init__(self, kind: str, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.missing = missing   # the executable (argv[0]) does not exist


@dataclass(slots=True)
class TargetResult:
    metrics: list[Metric] = field(default_factory=list)
    errors: list[CollectError] = field(default_factory=list)


class IptablesCollector:
    """Reads iptables-save and ip6tables-save (legacy and/or nft) per target and reports per-port protection."""

    name = "iptables"

    def __init__(self, config: Config) -> None:
        self.config = config

    def collect(self) -> Round:
        self._check_privilege()
        targets = self.config.targets
        with ThreadPoolExecutor(max_workers=min(self.config.max_concurrency, len(targets)),
                                thread_name_prefix="iptables") as pool:
            results = list(pool.map(self._collect_target, targets))
        out = Round()
        for r in results:
            out.metrics.extend(r.metrics)
            out.errors.extend(r.errors)
        return out

    def _check_privilege(self) -> None:
        if self.config.command_prefix:
            return  # the wrapper (sudo, ...) is what grants the privilege
        missing = missing_network_capabilities()
        if missing:
            raise CollectorUnavailable(
                f"iptables collector lacks {' and '.join(missing)}: iptables-save cannot read the "
                "ruleset. Run it as root, grant the capabilities (systemd: AmbientCapabilities="
                "CAP_NET_ADMIN CAP_NET_RAW), or set command_prefix: [sudo, -n] with a sudoers rule "
                "for iptables-save.")

    # -- one target -------------------------------------------------------------------------

    def _collect_target(self, target: Target) -> TargetResult:
        result = TargetResult()
        try:
            ports = self._read_ports(target)
            rulesets = self._read_rulesets(target)
            ts = time.time()
            port_metrics = self._port_metrics(target, ports, rulesets, ts)
        except TargetFailed as e:
            result.errors.append(CollectError(target.host, e.kind, str(e)))
            return result
        result.metrics.extend(port_metrics)
        result.metrics.append(self._ruleset_metric(target, ports, rulesets, port_metrics, ts))
        for package, version in self._read_versions(target, result).items():
            result.metrics.append(metric("iptables_software", {"version": version},
                                         {"host": target.host, "package": package}, ts))
        return result

    def _read_ports(self, target: Target) -> list[VmPort]:
        try:
            if target.ports_file is not None:
                return read_ports_file(target.ports_file)
            assert target.ports_command is not None
            res = self._run(target.ports_command, what="ports_command")
            if res.returncode != 0:
                raise TargetFailed("tool", f"ports_command exited {res.returncode}: {_preview(res.stderr)}")
            return parse_ports(res.stdout, "ports_command output")
        except PortsError as e:
            raise TargetFailed("parse", str(e)) from None

    def _read_rulesets(self, target: Target) -> dict[Source, Ruleset]:
        return {src: r for family in self.config.families for src, r in self._read_family(target, family).items()}

    def _read_family(self, target: Target, family: str) -> dict[Source, Ruleset]:
        backends = ["legacy", "nft"] if self.config.backend == "auto" else [self.config.backend]
        read: dict[Source, Ruleset] = {}
        for backend in backends:
            tool = SAVE_TOOLS[(family, backend)]
            argv = self._in_netns(target, [tool])
            cmd = [*self.config.command_prefix, *argv]
            try:
                res = self._run(cmd, what=tool)
            except TargetFailed as e:
                if e.missing and cmd[0] == tool and self.config.backend == "auto":
                    continue  # backend not installed: it cannot hold rules either
                raise   # a missing wrapper (sudo, ip) or output past the bound is no absent backend
            if self.config.backend == "auto" and tool_not_found(res, tool):
                continue  # the same, said by a wrapper (ip netns exec, sudo, env) with its exit status
            self._check_save_result(res, tool)
            try:
                read[(family, backend)] = parse_ruleset(res.stdout)
            except RulesetParseError as e:
                raise TargetFailed("parse", f"{tool} output: {e}") from None
        if not read:
            tools = " nor ".join(SAVE_TOOLS[(family, b)] for b in backends)
            raise TargetFailed("tool", f"neither {tools} could be run: install the iptables package")
        if self.config.backend == "auto":
            with_rules = {src: r for src, r in read.items() if not r.empty}
            return with_rules or read
        return read

    def _check_save_result(self, res: ToolResult, tool: str) -> None:
        if res.returncode == 0:
            return
        if "Cannot open network namespace" in res.stderr:
            raise TargetFailed("unreachable", _preview(res.stderr))
        # checked before the privilege: the wrapper's exec says "Permission denied" for a file mode too
        if tool_not_executable(res, tool):
            raise TargetFailed("tool", f"{tool} is not executable (its file mode, or a noexec mount): the wrapper "
                                       f"could not run it ({_preview(res.stderr)})")
        if looks_like_permission_error(res.stderr):
            raise TargetFailed("permission", f"{tool}: permission denied: the collector needs root or "
                                             f"CAP_NET_ADMIN+CAP_NET_RAW ({_preview(res.stderr)})")
        raise TargetFailed("tool", f"{tool} exited {res.returncode}: {_preview(res.stderr)}")

    def _read_versions(self, target: Target, result: TargetResult) -> dict[str, str]:
        packages = self.config.packages
        argv = target.versions_command or dpkg_query_argv(packages)
        try:
            res = self._run(argv, what="versions command")
        except TargetFailed as e:
            if target.versions_command is not None:  # the operator asked for it: say it failed
                result.errors.append(CollectError(target.host, e.kind, str(e)))
            return {p: UNKNOWN for p in packages}
        return parse_versions(res.stdout, packages)

    # -- metrics ----------------------------------------------------------------------------

    def _port_metrics(self, target: Target, ports: list[VmPort], rulesets: dict[Source, Ruleset],
                      ts: float) -> list[Metric]:
        out = []
        for port in ports:
            # Per family, both backends' tables are evaluated by the kernel: protection in either suffices.
            # Across families every one must protect the port: IPv6 traffic never meets iptables' rules.
            by_family: dict[str, tuple[str, PortStatus]] = {}
            for family in self.config.families:
                statuses = {b: analyze_port(r, self.config.chain_prefix, port.port_id, port.device)
                            for (f, b), r in rulesets.items() if f == family}
                by_family[family] = max(statuses.items(), key=lambda bs: _rank(bs[1]))
            family, (backend, status) = min(by_family.items(), key=lambda fs: _rank(fs[1][1]))
            tags = {"host": target.host, "port_id": port.port_id, "device": port.device, "vm": port.vm}
            if port.tenant:
                tags["tenant"] = port.tenant
            fields: dict[str, int | str] = {
                "protected": int(status.protected),
                "ingress_chain": int(status.ingress_chain), "egress_chain": int(status.egress_chain),
                "spoof_chain": int(status.spoof_chain),
                "ingress_jump": int(status.ingress_jump), "egress_jump": int(status.egress_jump),
                "ingress_rules": status.ingress_rules, "egress_rules": status.egress_rules,
                "spoof_rules": status.spoof_rules,
                "ingress_default_drop": int(status.ingress_default_drop),
                "backend": backend,
                "family": family,   # the family the fields above describe: the weakest one
            }
            for f, (_, st) in by_family.items():
                fields[f"protected_{f}"] = int(st.protected)
            if status.reason:
                fields["reason"] = f"{family}: {status.reason}" if len(by_family) > 1 else status.reason
            try:
                out.append(metric("iptables_vm_port", fields, tags, ts))
            except WireError as e:  # a tag value from the ports list the wire format refuses
                raise TargetFailed("parse", f"port {port.port_id}: {e}") from None
        return out

    def _ruleset_metric(self, target: Target, ports: list[VmPort], rulesets: dict[Source, Ruleset],
                        port_metrics: list[Metric], ts: float) -> Metric:
        protected = sum(int(m.fields["protected"]) for m in port_metrics if m.name == "iptables_vm_port")
        pairs = [(f"{family}/{backend}", r) for (family, backend), r in sorted(rulesets.items())]
        return metric("iptables_ruleset", {
            "fingerprint": fingerprint(pairs),
            "base_fingerprint": fingerprint(pairs, exclude_ports_with_prefix=self.config.chain_prefix),
            "rules": sum(r.rule_count for r in rulesets.values()),
            "chains": sum(r.chain_count for r in rulesets.values()),
            "backend": "+".join(sorted({b for _, b in rulesets})),
            "families": "+".join(sorted({f for f, _ in rulesets})),
            "ports_expected": len(ports),
            "ports_protected": protected,
            "ports_unprotected": len(ports) - protected,
        }, {"host": target.host}, ts)

    # -- tools ------------------------------------------------------------------------------

    def _in_netns(self, target: Target, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", target.netns, *argv] if target.netns else argv

    def _run(self, argv: list[str], what: str) -> ToolResult:
        try:
            return run_tool(argv, self.config.timeout_s)
        except ToolNotExecutable as e:   # there but not runnable: an error, never a backend not installed
            raise TargetFailed("tool", f"{what}: {e}") from None
        except ToolMissing as e:
            raise TargetFailed("tool", f"{what}: {e}", missing=True) from None
        except ToolOutputTooLarge as e:
            raise TargetFailed("tool", f"{what}: {e}") from None
        except ToolTimeout as e:
            raise TargetFailed("timeout", f"{what}: {e}") from None


# What a wrapper (ip netns exec, sudo, env, nsenter, a shell) says when the command it was given does not exist
_NOT_FOUND = ("No such file or directory", "command not found", ": not found")


def tool_not_found(res: ToolResult, tool: str) -> bool:
    """A failed run whose stderr says ``tool`` itself could not be found: ``exec of "iptables-legacy-save"
    failed: No such file or directory`` (ip netns exec), ``sudo: ...: command not found``, ``env: '...': No
    such file or directory``. The save tools' own errors start with their version banner, never this."""
    if res.returncode == 0:
        return False
    return any(re.search(rf"(?<![\w.-]){re.escape(tool)}(?![\w.-])", line) and any(n in line for n in _NOT_FOUND)
               for line in res.stderr.splitlines())


def tool_not_executable(res: ToolResult, tool: str) -> bool:
    """A failed run whose stderr says a wrapper could not exec ``tool`` (EACCES): ``exec of "iptables-nft-save"
    failed: Permission denied`` (ip netns exec), ``env: '...': Permission denied``, ``nsenter: failed to execute
    ...: Permission denied``. The tool's own refusal puts its version banner between name and message
    (``iptables-legacy-save v1.8.9 (legacy): Cannot initialize: Permission denied``): a privilege problem."""
    if res.returncode == 0:
        return False
    exec_denied = re.compile(rf"(?<![\w.-]){re.escape(tool)}['\"\u2019]?(?: failed)?: Permission denied")
    return any(exec_denied.search(line) for line in res.stderr.splitlines())


def _rank(status: PortStatus) -> tuple[int, int, int, int]:
    return (int(status.protected), int(status.ingress_jump) + int(status.egress_jump),
            int(status.ingress_chain) + int(status.egress_chain), status.ingress_rules)


def _preview(text: str) -> str:
    text = " ".join(text.split())
    return text[:_ERR_PREVIEW] + ("..." if len(text) > _ERR_PREVIEW else "") if text else "(no output)"
