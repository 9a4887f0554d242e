"""Session fixture: one real Keystone (uWSGI, SQLite, fernet) + S3 front end (nginx + gateway) per session.

Import ``keystone_lab`` into a test module to use it. Start-up (~30-40 s: keystone-manage steps,
provisioning) is paid once; every process is stopped by PID at the end of the session.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from opsloop.lab.keystone_server import KeystoneLab

S3_USERS = 4
_LAB: KeystoneLab | None = None


@pytest.fixture(scope="session")
def keystone_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeystoneLab]:
    global _LAB
    if _LAB is not None:  # imported into several modules: still one server per session
        yield _LAB
        return
    lab = KeystoneLab(tmp_path_factory.mktemp("keystone-lab"), s3_users=S3_USERS, caching=True)
    lab.start()
    _LAB = lab
    try:
        yield lab
    finally:
        _LAB = None
        lab.stop()
