"""Re-capture this folder's files from real ipmitool 1.8.19 against simulated BMCs (ipmi_sim).

    .venv/bin/python -m opsloop.collectors.ipmi.testdata.capture

Each case writes <case>.stdout and <case>.stderr exactly as ipmitool printed them, with the
argv the collector uses (-I lanplus -E -L ADMINISTRATOR -N 1 -R 1 -v -C 3).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from opsloop.collectors.ipmi.bmcsim import BMCFleet, BMCSpec

HERE = Path(__file__).resolve().parent


def _run(bmc_port: int, user: str, password: str, command: list[str]) -> tuple[str, str]:
    argv = ["ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(bmc_port), "-U", user, "-E",
            "-L", "ADMINISTRATOR", "-N", "1", "-R", "1", "-v", "-C", "3", *command]
    env = {"PATH": os.environ["PATH"], "LANG": "C", "IPMI_PASSWORD": password}
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
    return res.stdout, res.stderr


def main() -> None:
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
            (HERE / f"{case}.stdout").write_text(out)
            (HERE / f"{case}.stderr").write_text(err)
            print(f"{case}: {len(out)} bytes stdout, {len(err)} bytes stderr")


if __name__ == "__main__":
    main()
