"""`opsloop deadletter summary` masks each reason (normalise_reason) to group alike refusals: a long reason of a
hostile or garbled dead letter must not stall it. Before, the id and number patterns rescanned the text from
every position: 18 s for a 16 KB reason of "a-a-a-...", minutes for a 64 KB one, per dead letter."""

from __future__ import annotations

import json
import subprocess
import sys

from opsloop.deadletter_cli import REASON_CHARS, normalise_reason
from tests.helpers import REPO

LIMIT_S = 60.0   # a hang guard, not a speed check: the masking takes milliseconds; before, many minutes

# in a process of its own: a regular expression holds the GIL for its whole run, a thread could not time it out
MASK_HOSTILE = """
import json
from opsloop.deadletter_cli import normalise_reason
from tests.core.test_deadletter_reason_masking import HOSTILE
print(json.dumps([normalise_reason(r) for r in HOSTILE]))
"""


HOSTILE = [
    "a-" * 32_000,              # word boundaries in a run of hex letters and dashes, no digit
    "1" * 64_000 + "x",         # a run of digits followed by a letter
    "aaaa-" * 13_000 + "g",
    "'a\\" * 20_000,            # unterminated quotes with escapes
]


def test_a_long_reason_of_any_shape_is_masked_without_stalling() -> None:
    try:
        done = subprocess.run([sys.executable, "-c", MASK_HOSTILE], capture_output=True, text=True, cwd=REPO,
                              timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"masking the hostile reasons still running after {LIMIT_S} s") from None
    assert done.returncode == 0, done.stderr
    masked = json.loads(done.stdout)
    assert all(len(m) <= REASON_CHARS for m in masked)
    assert masked[0].startswith("a-a-a-") and masked[1] == "<id>"   # hex digits: an id


def test_the_masks_are_the_same_as_before() -> None:
    cases = {
        "lb12 down at 14:03, retry 3": "lb1N down at N:N, retry N",
        "series deadbeef-cafe-1234 gone": "series <id> gone",
        "key deadbeefcafe-12 bad": "key <id>N bad",         # a digit after the dash: the run holds one
        "key deadbeefcafe bad": "key deadbeefcafe bad",     # no digit: a word, not an id
        "value -12.5e3 and +7, 12-5": "value N and N, NN",
        "name 'ipmi \\' power' at \"x\"": "name '…' at '…'",
    }
    assert {r: normalise_reason(r) for r in cases} == cases
