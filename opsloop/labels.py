"""Label sets as one unambiguous string: the key of a finding, a tag set or a detector's series; and the one bound
on a label value every stage applies (:func:`shorten`)."""

from __future__ import annotations

import hashlib
from typing import Iterable, Mapping

# A finding's where-label value as the stream worker exports it (opsloop_finding_active, which the rule backstops
# carry) and as the paging actuator posts it: one bound, one shortening, so Alertmanager's inhibition finds the
# page and its backstop equal (before, 128 there and 256 here: one finding paged twice under two labels).
MAX_LABEL_VALUE = 256


def shorten(text: str, limit: int = MAX_LABEL_VALUE) -> str:
    """``text`` if it fits, else a prefix and a hash of the whole, ``limit`` characters in all (distinct texts stay
    distinct; the same text always gives the same value)."""
    if len(text) <= limit:
        return text
    return text[: limit - 9] + "_" + hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]

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
