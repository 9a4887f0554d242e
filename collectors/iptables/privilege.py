"""Do we hold the capabilities iptables-save needs (CAP_NET_ADMIN, and CAP_NET_RAW for legacy)?

Checked up front because an unprivileged iptables-legacy-save in a namespace without loaded
tables prints nothing and exits 0: an empty "all fine" is exactly what must never happen.
"""

from __future__ import annotations

from pathlib import Path

CAP_NET_ADMIN = 12
CAP_NET_RAW = 13


def effective_capabilities(status_path: Path = Path("/proc/self/status")) -> int:
    for line in status_path.read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise RuntimeError(f"no CapEff line in {status_path}")


def missing_network_capabilities(status_path: Path = Path("/proc/self/status")) -> list[str]:
    caps = effective_capabilities(status_path)
    return [name for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_NET_RAW, "CAP_NET_RAW"))
            if not caps >> bit & 1]


def looks_like_permission_error(stderr: str) -> bool:
    s = stderr.lower()
    return "permission denied" in s or "operation not permitted" in s or "you must be root" in s
