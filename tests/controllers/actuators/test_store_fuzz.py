"""The weight history file (controllers/actuators/store.py) with any lines in it: JSON objects of any shape
with the entry's keys, or bytes: reading it gives the entries or a StoreError naming the file and line,
never another exception (one was a traceback of `weights history` and a failed apply on every decision)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings, strategies as st

from opsloop.controllers.actuators.store import StoreError, WeightStore

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5))
VALUES = st.recursive(SCALARS, lambda c: st.one_of(st.lists(c, max_size=3),
                                                   st.dictionaries(st.text(max_size=5), c, max_size=3)), max_leaves=8)
KEYS = st.sampled_from(["version", "epoch", "weights", "shares", "decision", "applied_at", "computed_at",
                        "complete", "action", "reason", "unknown"])
LINES = st.one_of(st.dictionaries(KEYS, VALUES, max_size=10).map(lambda d: json.dumps(d).encode()),
                  st.binary(max_size=30))


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(LINES, max_size=4), torn=st.binary(max_size=10))
def test_any_history_is_entries_or_a_store_error(lines: list[bytes], torn: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = WeightStore(Path(tmp), "e", "l")
        store.path.parent.mkdir(parents=True)
        store.path.write_bytes(b"\n".join(lines) + b"\n" + torn.replace(b"\n", b""))
        for read in (store.history, store.last, store.high_stamp, store.high_water):
            try:
                read()
            except StoreError as e:
                assert str(store.path) in str(e) and "\n" not in str(e), str(e)
