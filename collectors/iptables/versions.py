"""Versions of the packages whose mismatch caused the incident of "Temporary elevated reachability" (iptables, Neutron agent).

Default source is ``dpkg-query -W -f '${Package}\t${Version}\t${db:Status-Abbrev}\n' PKG...``:
dpkg prints the installed ones and exits 1 for the rest ("no packages found matching"); a
package that is only half there (removed, config files left: status ``rc``) counts as missing.
A configured command may print ``name version`` lines instead (e.g. ``rpm -q --qf``, a
container image label lookup). Missing packages are reported as ``unknown``.
"""

from __future__ import annotations

UNKNOWN = "unknown"


def dpkg_query_argv(packages: list[str]) -> list[str]:
    return ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n", *packages]


def parse_versions(text: str, packages: list[str]) -> dict[str, str]:
    """Map each requested package to its version, ``unknown`` when absent or not installed."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split("\t") if "\t" in line else line.split()
        if len(parts) < 2:
            continue
        name, version = parts[0].strip(), parts[1].strip()
        status = parts[2].strip() if len(parts) > 2 else "ii"
        name = name.split(":", 1)[0]  # dpkg multiarch "pkg:amd64"
        if name and version and status.startswith("ii"):
            found[name] = version[:128]
    return {p: found.get(p, UNKNOWN) for p in packages}
