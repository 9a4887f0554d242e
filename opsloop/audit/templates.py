"""The Elasticsearch index templates opsloop ships (``opsloop/audit/templates/*.json``).

* ``audit.json``: the audit trail, a data stream ``opsloop-audit*`` with keyword mappings
  (written by :mod:`opsloop.audit.indexer`);
* ``logs.json``: service logs shipped by Filebeat (``opsloop-logs-*`` daily indices; the same file is
  mounted into the Filebeat container by ``docker-compose/``).
  ``opsloop.fields`` has ``subobjects: false``: a key that is an object in one line and a value in another
  (``error={...}``, ``error="refused"``) is two leaves, not a mapping conflict that refuses one kind (400)
  for the rest of the daily index.

Only core Elasticsearch features are used (no ingest pipeline, no ILM): they work on the
integ-test distribution the tests run and on any 8.x cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
AUDIT_TEMPLATE = "opsloop-audit"
# the audit data stream by default; any name the audit template's index pattern matches will do
DEFAULT_STREAM = "opsloop-audit"
LOGS_TEMPLATE = "opsloop-logs"
_FILES = {AUDIT_TEMPLATE: "audit.json", LOGS_TEMPLATE: "logs.json"}


def load_template(name: str) -> dict[str, Any]:
    try:
        path = TEMPLATES_DIR / _FILES[name]
    except KeyError:
        raise ValueError(f"unknown index template {name!r} (known: {', '.join(_FILES)})") from None
    body: dict[str, Any] = orjson.loads(path.read_bytes())
    return body


def install_template(client: Any, name: str) -> None:
    """Create or update the composable index template ``name`` (idempotent)."""
    body = load_template(name)
    client.indices.put_index_template(name=name, **body)
