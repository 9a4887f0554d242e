"""Session fixture (a plugin of tests/conftest.py): one real Elasticsearch 8.19 for the audit-trail, log and
log-template tests.

Started once (15-90 s on a busy machine) as user nobody by ``opsloop.stack.elasticsearch``, on free
loopback ports, in a world-traversable temp dir (pytest's own tmp root is 0700), stopped by PID.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from opsloop.stack import free_port
from opsloop.stack.elasticsearch import elasticsearch


@pytest.fixture(scope="session")
def es_url() -> Iterator[str]:
    data = Path(tempfile.mkdtemp(prefix="opsloop-es-"))
    os.chmod(data, 0o755)
    port = free_port()
    es = elasticsearch(data, "127.0.0.1", port, free_port())
    try:
        es.start()
        yield f"http://127.0.0.1:{port}"
    finally:
        es.stop()
        shutil.rmtree(data, ignore_errors=True)
