"""`opsloop edge run` whose API port is taken exits 75 (EX_TEMPFAIL: the unit restarts it, the port may be free
then), says which address, and ends: the demand consumer it had started once Kafka answered is stopped too (a
process left running without its API would hold the unit "active" with no way to reach it). The API binds only
after Kafka answers, so the real broker is needed to get there."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from opsloop import exitcodes
from tests.helpers import REPO, unique

SECRET = "an-edge-token-of-32-characters!!"
TOPOLOGY = ("listeners:\n  - name: web\n    edges: [{name: e1}]\n"
            "    origins: [{name: near, capacity_rps: 40}, {name: far, capacity_rps: 40}]\n"
            "    latency_ms: {e1: {near: 2, far: 30}}\n")


def edge_run(tmp_path: Path, bootstrap: str, api_port: int, token_mode: int) -> subprocess.CompletedProcess[str]:
    """`opsloop edge run` with the API on ``api_port`` and its token file in ``token_mode``, to its exit."""
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    token = tmp_path / "edge.token"
    token.touch(mode=0o600)
    token.write_text(SECRET + "\n")
    token.chmod(token_mode)
    cfg = tmp_path / "opsloop.yaml"
    cfg.write_text(f"kafka: {{bootstrap_servers: '{bootstrap}', topic_prefix: {unique('apiport')}.}}\n"
                   f"controllers:\n  edge:\n    topology_file: {topo}\n    overrides_file: null\n"
                   f"    metrics_port: 0\n    api: {{enabled: true, port: {api_port}, token_file: {token}}}\n")
    r = subprocess.run([sys.executable, "-m", "opsloop.cli", "edge", "run", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in r.stderr and SECRET not in r.stderr + r.stdout, r.stderr[-2000:]
    return r


def test_a_taken_api_port_exits_75_and_the_process_ends(kafka_bootstrap: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = edge_run(tmp_path, kafka_bootstrap, port, 0o600)
    assert r.returncode == exitcodes.TEMPFAIL == 75, (r.returncode, r.stderr[-2000:])
    assert f"{port}" in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]


def test_a_token_file_that_can_never_work_exits_78_before_kafka_answers(tmp_path: Path) -> None:
    """The token was read only once a broker answered: with Kafka away a token file open to others kept the
    service waiting for Kafka in silence, and the unit "active", instead of saying what to fix."""
    with socket.socket() as nobody:   # a port bound but never listened on: connections are refused
        nobody.bind(("127.0.0.1", 0))
        r = edge_run(tmp_path, f"127.0.0.1:{nobody.getsockname()[1]}", 0, 0o644)
    assert r.returncode == exitcodes.CONFIG == 78, (r.returncode, r.stderr[-2000:])
    last = r.stderr.strip().splitlines()[-1]
    assert f"token_file {tmp_path / 'edge.token'}" in last and "0644" in last, r.stderr[-2000:]
