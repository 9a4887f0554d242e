"""A recording stand-in for ipvsadm (this kernel has no IPVS): ``fake_ipvsadm.py --state FILE ARGS...``.

State (JSON) holds the services; ``-Ln [--exact]`` prints them in ipvsadm 1.31's layout
(``print_title``: header lines; ``print_service_entry``: ``"%s  %s %s"`` service, ``"  -> %-28s
%-7s %-6d %-10u %-10u"`` real server). ``-R`` reads ``-e`` lines from stdin and edits weights (and
forwarding) line by line, failing like ipvsadm at the first bad line (earlier lines stay applied).
An edit sets a real's connection thresholds (``-x``/``-y``) to what it gives, 0 when left out, as the kernel
does (``__ip_vs_update_dest``); ``-Ln --exact --thresholds`` prints them
(``"  -> %-28s %-10u %-10u %-10u %-10u"``). Tunnel settings as ipvsadm >= 1.30 on kernel >= 5.2: an edit sets
``--tun-type``/``--tun-port``/``--tun-nocsum|--tun-csum|--tun-remcsum`` to what it gives, ipip / 0 / nocsum when
left out (libipvs always sends the three attributes), refused as ipvsadm refuses them (``tunnel_opt_check``);
``-Ln --tun-info`` prints ``"  -> %-28s %-7s %-13s %-6d %-10u %-10u"`` (TunnelInfo ``ipip``, ``gue:PORT:FLAGS``,
``gre:FLAGS``, ``n/a`` when not tunnelled).
Every call is appended to ``<state>.calls`` (argv + stdin). A ``<state>.mode`` file switches
behaviour: ``fail`` = the no-IPVS-kernel error (exit 2), ``freeze`` = accept edits but change nothing,
``old`` = ipvsadm before 1.30 (no tunnel options: ``--tun-*`` is an invalid option).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NO_KERNEL = ("Can't initialize ipvs: Protocol not available\n"
             "Are you sure that IP Virtual Server is built in the kernel or as module?\n")
FORWARD = {"-g": "Route", "-m": "Masq", "-i": "Tunnel"}
TUN_FLAGS = {"--tun-nocsum": "-c", "--tun-csum": "+c", "--tun-remcsum": "r+c"}   # ipvsadm.c tunflags[]


def tun_info(r: dict) -> str:
    """ipvsadm.c ``fwd_tun_info``: a tunnelled real's type (port, checksum flags), else ``n/a``."""
    if r["fwd"] != "Tunnel":
        return "n/a"
    kind = r.get("tun_type", "ipip")
    if kind == "gue":
        return f"gue:{r.get('tun_port', 0)}:{r.get('tun_flags', '-c')}"
    if kind == "gre":
        return f"gre:{r.get('tun_flags', '-c')}"
    if kind == "unlisted":
        return "n/a"   # a tunnel type this ipvsadm does not know (test_lvs_tunnels.py)
    return "ipip"


def listing(state: dict, thresholds: bool = False, tunnels: bool = False) -> str:
    if tunnels:
        out = ["IP Virtual Server version 1.2.1 (size=4096)", "Prot LocalAddress:Port Scheduler Flags",
               "  -> RemoteAddress:Port           Forward TunnelInfo    Weight ActiveConn InActConn"]
    elif thresholds:
        out = ["IP Virtual Server version 1.2.1 (size=4096)",
               "Prot LocalAddress:Port            Uthreshold Lthreshold ActiveConn InActConn",
               "  -> RemoteAddress:Port"]
    else:
        out = ["IP Virtual Server version 1.2.1 (size=4096)", "Prot LocalAddress:Port Scheduler Flags",
               "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn"]
    for svc in state["services"]:
        out.append(f"{svc['proto']}  {svc['addr']} {svc['sched']}" + (f" {svc['flags']}" if svc.get("flags") else ""))
        for r in svc["reals"]:
            if tunnels:
                out.append(f"  -> {r['addr']:<28} {r['fwd']:<7} {tun_info(r):<13} {r['w']:<6d} {r['active']:<10d} "
                           f"{r['inactive']:<10d}")
            elif thresholds:
                out.append(f"  -> {r['addr']:<28} {r.get('x', 0):<10d} {r.get('y', 0):<10d} {r['active']:<10d} "
                           f"{r['inactive']:<10d}")
            else:
                out.append(f"  -> {r['addr']:<28} {r['fwd']:<7} {r['w']:<6d} {r['active']:<10d} {r['inactive']:<10d}")
    return "\n".join(out) + "\n"


def edit(state: dict, tokens: list[str], old: bool = False) -> str | None:
    """Apply one ``-e`` line; an error text (as ipvsadm prints it) or None. ``old``: ipvsadm before 1.30."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t in TUN_FLAGS and not old:
            if "flags" in opts:
                return f"ipvsadm: The option '{t[2:]}' conflicts with the '{opts['flags'][2:]}' option"
            opts["flags"] = t
            i += 1
        elif t in ("--tun-type", "--tun-port") and not old and i + 1 < len(tokens):
            opts[t] = tokens[i + 1]
            i += 2
        elif t in FORWARD:
            opts["fwd"] = FORWARD[t]
            i += 1
        elif t in ("-e", ):
            i += 1
        elif t in ("-t", "-u", "-f", "-r", "-w", "-x", "-y") and i + 1 < len(tokens):
            opts[t] = tokens[i + 1]
            i += 2
        else:
            return f"ipvsadm: invalid option -- '{t}'"
    proto = "TCP" if "-t" in opts else "UDP" if "-u" in opts else "FWM"
    addr = opts.get("-t") or opts.get("-u") or opts.get("-f")
    svc = next((s for s in state["services"] if s["proto"] == proto and s["addr"] == addr), None)
    if svc is None:
        return "Memory allocation problem" if addr is None else "No such service"
    real = next((r for r in svc["reals"] if r["addr"] == opts.get("-r")), None)
    if real is None:
        return "No such destination"
    weight = int(opts.get("-w", "1"))
    if not 0 <= weight <= 65535:
        return f"Illegal weight specified"
    tunnel = {k: v for k, v in opts.items() if k in ("--tun-type", "--tun-port", "flags")}
    kind = opts.get("--tun-type", "ipip")
    if tunnel and opts.get("fwd") != "Tunnel":
        return "Tunnel options conflict with forward method"
    if kind not in ("ipip", "gue", "gre"):
        return "illegal tunnel type specified"
    if kind == "gue" and "--tun-port" not in opts:
        return "You need to supply the 'tun-port' option for the 'gue' tunnel type"
    if kind != "gue" and "--tun-port" in opts or kind == "ipip" and "flags" in opts:
        return f"Illegal tunnel option with the '{kind}' tunnel type"
    if not state.get("frozen"):
        real["w"] = weight
        real["fwd"] = opts.get("fwd", "Route")  # an edit without -g/-m/-i resets to direct routing
        real["x"], real["y"] = int(opts.get("-x", "0")), int(opts.get("-y", "0"))  # and without -x/-y: no limit
        # and without --tun-*: ipip, no port, no checksum (__ip_vs_update_dest sets all three from every edit)
        real["tun_type"], real["tun_port"] = kind, int(opts.get("--tun-port", "0"))
        real["tun_flags"] = TUN_FLAGS[opts.get("flags", "--tun-nocsum")]
    return None


def main(argv: list[str]) -> int:
    assert argv[0] == "--state"
    path = Path(argv[1])
    args = argv[2:]
    stdin = sys.stdin.read() if "-R" in args else None
    with open(str(path) + ".calls", "a") as calls:
        calls.write(json.dumps({"argv": args, "stdin": stdin}) + "\n")
    mode_file = Path(str(path) + ".mode")
    mode = mode_file.read_text().strip() if mode_file.exists() else ""
    if mode == "fail":
        sys.stderr.write(NO_KERNEL)
        return 2
    state = json.loads(path.read_text())
    state["frozen"] = mode == "freeze"
    if args[:1] == ["-Ln"]:
        if "--tun-info" in args and mode == "old":
            sys.stderr.write("ipvsadm: invalid option `--tun-info'\n")   # fail(2, "invalid option `%s'")
            return 2
        sys.stdout.write(listing(state, thresholds="--thresholds" in args, tunnels="--tun-info" in args))
        return 0
    if args == ["-R"]:
        for n, line in enumerate((stdin or "").splitlines(), start=1):
            if not line.strip():
                continue
            err = edit(state, line.split(), old=mode == "old")
            if err:
                state.pop("frozen")
                path.write_text(json.dumps(state))
                sys.stderr.write(f"{err}\nipvsadm: error on restore line {n}\n")
                return 1
        state.pop("frozen")
        path.write_text(json.dumps(state))
        return 0
    sys.stderr.write(f"fake ipvsadm: unsupported arguments {args}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
