"""Re-capture the IPMI collector's testdata (collectors/ipmi/testdata/) from real ipmitool 1.8.19
against simulated BMCs (ipmi_sim).

    .venv/bin/python -m opsloop.lab.bmcsim.capture

Each case writes <case>.stdout and <case>.stderr exactly as ipmitool printed them, with the
argv the collector uses (-I lanplus -E -L ADMINISTRATOR -N 1 -R 1 -v -C 3).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from opsloop.config import REPO_ROOT
from opsloop.lab.bmcsim import BMCFleet, BMCSpec

# The collector's own folder: the lab writes the captures, the collector's tests read them.
OUT_DIR = REPO_ROOT / "collectors" / "ipmi" / "testdata"


def _run(bmc_port: int, user: str, password: str, command: list[str]) -> tuple[str, str]:
    argv = ["ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(bmc_port), "-U", user, "-E",
            "-L", "ADMINISTRATOR", "-N", "1", "-R", "1", "-v", "-C", "3", *command]
    env = {"PATH": os.environ["PATH"], "LANG": "C", "IPMI_PASSWORD": password}
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
    return res.stdout, res.stderr


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m opsloop.lab.bmcsim.capture", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="examples:\n  python -m opsloop.lab.bmcsim.capture\n"
                                       "  python -m opsloop.lab.bmcsim.capture --out /tmp/ipmi-captures\n")
    p.add_argument("--out", type=Path, default=OUT_DIR, help="where the captures go (default %(default)s)")
    return p


def main(argv: list[str] | None = None) -> None:
    out_dir = build_parser().parse_args(argv).out
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = [BMCSpec("dcmi", watts="155 136 248 160"), BMCSpec("nodcmi", dcmi=False, watts=205, sdr_no_reading=True),
             BMCSpec("deact", watts="na"), BMCSpec("short", watts="short"), BMCSpec("dead", dead=True)]
    dcmi, sdr = ["dcmi", "power", "reading"], ["-c", "sdr", "elist", "full"]
    with tempfile.TemporaryDirectory() as tmp, BMCFleet(specs, Path(tmp)) as fleet:
        cases = {
            "dcmi_power_reading": (fleet["dcmi"], None, dcmi),
            "dcmi_deactivated": (fleet["deact"], None, dcmi),
            "dcmi_short_reply": (fleet["short"], None, dcmi),
            "dcmi_unsupported": (fleet["nodcmi"], None, dcmi),
            "sdr_elist_full": (fleet["nodcmi"], None, sdr),
            "wrong_password": (fleet["dcmi"], "not-the-password", dcmi),
            "unreachable": (fleet["dead"], None, dcmi),
        }
        for case, (bmc, password, command) in cases.items():
            out, err = _run(bmc.port, bmc.spec.username, password or bmc.spec.password, command)
            (out_dir / f"{case}.stdout").write_text(out)
            (out_dir / f"{case}.stderr").write_text(err)
            print(f"{case}: {len(out)} bytes stdout, {len(err)} bytes stderr")


if __name__ == "__main__":
    main()
