"""Running the real Telegraf (built by setup.d/60-telegraf.sh) on opsloop's sample configs in tests.

The configs in collectors/telegraf/ (``telegraf.conf``: the agent and its Kafka output; ``telegraf.d/``:
one snippet per input) take their addresses from environment variables, so the tests run the very files
operators copy: every run loads ``telegraf.conf`` first, then the snippets. ``run_once`` adds an
``outputs.file`` with the same JSON settings as the ``outputs.kafka`` and selects it with
``--output-filter``: one gather, the records as opsloop would receive them, no broker needed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from opsloop.stack import ManagedProcess
from opsloop.records import Metric
from opsloop.wire import parse_record
from tests.helpers import REPO

TELEGRAF = REPO / ".cache" / "telegraf" / "telegraf"
SETUP_SCRIPT = REPO / "setup.d" / "60-telegraf.sh"
CONFIG_DIR = REPO / "collectors" / "telegraf"
AGENT_CONFIG = CONFIG_DIR / "telegraf.conf"
SNIPPET_DIR = CONFIG_DIR / "telegraf.d"
IPMITOOL_WRAPPER = CONFIG_DIR / "ipmitool-opsloop"
VERSION = "1.37.2"

FILE_OUTPUT = """
[[outputs.file]]
  files = ["{path}"]
  data_format = "json"
  json_timestamp_units = "1s"
"""


def ensure_telegraf() -> Path:
    """The cached binary; builds it (a few minutes, once) when missing."""
    if not TELEGRAF.exists():
        res = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=1200)
        if res.returncode != 0 or not TELEGRAF.exists():
            raise RuntimeError(f"building Telegraf failed: {res.stderr[-800:]}")
    return TELEGRAF


def sample_config(name: str) -> Path:
    """The input snippet ``telegraf.d/<name>.conf`` (loaded after :data:`AGENT_CONFIG`)."""
    return SNIPPET_DIR / f"{name}.conf"


def telegraf_argv(configs: list[Path], *args: str, command: tuple[str, ...] = ()) -> list[str]:
    """``command`` is a subcommand such as ("config", "check"): it goes before the flags.

    The agent config comes first, as operators load it; ``configs`` are snippets (or a directory,
    passed as ``--config-directory``)."""
    argv = [str(ensure_telegraf()), *command, "--strict-env-handling", "--config", str(AGENT_CONFIG)]
    for c in configs:
        if c.is_dir():
            argv += ["--config-directory", str(c)]
            continue
        argv += ["--config", str(c)]
    return argv + list(args)


def run_telegraf(configs: list[Path], env: dict[str, str], *args: str, prefix: list[str] | None = None,
                 command: tuple[str, ...] = (), timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), *telegraf_argv(configs, *args, command=command)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=timeout)


def run_once(config: Path, env: dict[str, str], tmp: Path, prefix: list[str] | None = None
             ) -> tuple[list[bytes], subprocess.CompletedProcess[str]]:
    """One gather of ``config`` written as JSON lines (one record per metric, as outputs.kafka sends)."""
    out = tmp / f"{config.stem}-{len(list(tmp.glob('*.jsonl')))}.jsonl"
    extra = tmp / f"{out.stem}-file-output.conf"
    extra.write_text(FILE_OUTPUT.format(path=out))
    res = run_telegraf([config, extra], env, "--once", "--output-filter", "file", prefix=prefix)
    records = [line for line in out.read_bytes().splitlines() if line.strip()] if out.exists() else []
    return records, res


def parse_all(records: list[bytes]) -> list[Metric]:
    """Every record through opsloop's wire parser; any rejection fails the test with its reason."""
    metrics: list[Metric] = []
    for raw in records:
        parsed = parse_record(raw)
        assert not parsed.rejected, [(r.reason, raw[:200]) for r in parsed.rejected]
        metrics.extend(parsed.metrics)
    return metrics


def telegraf_process(name: str, config: Path, env: dict[str, str], workdir: Path) -> ManagedProcess:
    """Telegraf as a long-running managed process (own process group, stopped by PID)."""
    return ManagedProcess(name=name, argv=telegraf_argv([config]), workdir=workdir, env=env)
