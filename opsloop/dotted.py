"""Reading a nested mapping by a dotted path (``controllers.edge``, ``systemd.unit``): one helper for the
config loader and the log search, which both address nested YAML/JSON documents this way."""

from __future__ import annotations

from typing import Any


def get_dotted(doc: dict[str, Any], path: str, *, flat_key: bool = False) -> Any:
    """The value at ``path`` (``a.b.c`` → ``doc["a"]["b"]["c"]``), or None when a step is missing or not a
    mapping. ``flat_key``: a key spelled with the dots (``doc["a.b.c"]``) wins, as log shippers may keep
    the dotted field name instead of nesting it."""
    if flat_key and path in doc:
        return doc[path]
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
