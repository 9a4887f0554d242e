#!/usr/bin/env bash
# The runtime dependencies (pinned in pyproject.toml) as wheels in .cache/wheelhouse, so the wheel test
# (tests/deploy/test_wheel.py) installs the built wheel into a fresh virtualenv with --no-index: no
# network at test time. Safe to interrupt anywhere: downloaded into a temporary folder, stamped with the
# pins' hash and only then renamed into place.
set -euo pipefail
source "$(dirname "$0")/lib/steps.bash"
ROOT="$(step_root)"
PY="$ROOT/.venv/bin/python"
HOUSE="$ROOT/.cache/wheelhouse"
# The pins, one per line (the [project] dependencies, plus what a fresh venv needs to build nothing).
pins=$("$PY" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PY
)
want=$(printf '%s\n' "$pins" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$HOUSE/.complete" 2>/dev/null)" = "$want" ]; then
  echo "wheelhouse: up to date"; exit 0
fi
TMP="$HOUSE.tmp"
rm -rf "$TMP"
mkdir -p "$TMP"
mapfile -t reqs <<<"$pins"
"$PY" -m pip download -q --only-binary=:all: --python-version 3.11 -d "$TMP" "${reqs[@]}"
write_atomic "$TMP/.complete" "$want"
rm -rf "$HOUSE"
mv "$TMP" "$HOUSE"
echo "wheelhouse: $(ls "$HOUSE" | wc -l) wheels"
