"""Label sets as one unambiguous string: the key of a finding, a tag set or a detector's series."""

from __future__ import annotations

from typing import Iterable, Mapping

_LABEL_ESCAPES = str.maketrans({"\\": "\\\\", ",": "\\,", "=": "\\=", "|": "\\|"})


def label_string(labels: Mapping[str, str], skip: Iterable[str] = ()) -> str:
    """``k=v`` pairs in key order joined by ``,``, with ``\\ , = |`` escaped by a backslash.

    Unambiguous (``{"host": "a,port=1"}`` and ``{"host": "a", "port": "1"}`` differ) and, for
    values without those characters, the same text as the plain join: ids built from it stay put."""
    skipped = frozenset(skip)
    items = [(k, v) for k, v in sorted(labels.items()) if k not in skipped]
    # Fast path (labels without those characters, nearly all): the plain join, recognised as such by
    # its separator counts. It is on the hot path of every finding book lookup.
    plain = ",".join(["%s=%s" % kv for kv in items])   # %s is str(), as below
    if (plain.count(",") == len(items) - 1 and plain.count("=") == len(items) and "\\" not in plain
            and "|" not in plain):
        return plain
    return ",".join(f"{str(k).translate(_LABEL_ESCAPES)}={str(v).translate(_LABEL_ESCAPES)}" for k, v in items)
