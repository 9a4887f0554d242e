"""Where opsloop finds its shipped files and keeps its state, in a checkout and when installed.

Shipped files (alert rules, the Alertmanager config and templates, dashboards) live in the repository's
top-level ``alerts/`` and ``dashboards/``; the wheel carries them as ``opsloop/alerts`` and
``opsloop/dashboards`` (package data, see setup.py), so ``shipped("alerts")`` finds them either way.

State (stream tables, collector spools, actuator history, paging state) defaults to ``.run/`` in a
source checkout, so ``make run`` keeps everything inside the tree, and to ``/var/lib/opsloop`` when
installed. ``$OPSLOOP_STATE_DIR`` (or ``opsloop --state-dir DIR``) overrides both; each path can also be
set on its own in the config file (``stream.data_dir``, ``collector.spool_dir``, ...).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
STATE_DIR_ENV = "OPSLOOP_STATE_DIR"
SYSTEM_STATE_DIR = Path("/var/lib/opsloop")


def checkout_root() -> Path | None:
    """The source checkout this package runs from (editable install or PYTHONPATH), else None."""
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "collectors" / "__init__.py").is_file():
        return root
    return None


def shipped(name: str) -> Path:
    """A shipped data folder (``alerts``, ``dashboards``): inside the installed package, else the checkout's."""
    installed = PACKAGE_DIR / name
    if installed.is_dir():
        return installed
    root = checkout_root()
    return (root if root is not None else PACKAGE_DIR.parent) / name


def state_dir() -> Path:
    """Default root of every state directory: $OPSLOOP_STATE_DIR, else .run/ in a checkout, else /var/lib/opsloop."""
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env).expanduser().resolve()
    root = checkout_root()
    return root / ".run" if root is not None else SYSTEM_STATE_DIR


def take_state_dir_option(argv: list[str]) -> list[str]:
    """``--state-dir DIR rest...`` or ``--state-dir=DIR rest...``: export DIR as $OPSLOOP_STATE_DIR, return rest."""
    first = argv[0]
    if first.startswith("--state-dir="):
        value, rest = first.partition("=")[2], argv[1:]
    elif first == "--state-dir":
        value, rest = (argv[1] if len(argv) > 1 else ""), argv[2:]
    else:
        raise ValueError(f"unknown option {first!r}")
    if not value or value.startswith("-"):
        raise ValueError("--state-dir needs a directory (e.g. opsloop --state-dir /srv/opsloop page run)")
    os.environ[STATE_DIR_ENV] = value
    return rest


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read, from its creation (no window in which another
    user may read it): Alertmanager configs (a receiver URL is often its own token, or carries
    user:password@), routing keys, passwords."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # a file that was there before keeps its mode otherwise
        f.write(text)
