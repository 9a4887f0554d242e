#!/usr/bin/env bash
# The project's virtualenv with pinned dependencies; re-installs only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV="$ROOT/.venv"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
stamp="$VENV/.opsloop-installed"
want=$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "python: venv up to date"; exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VENV/bin/pip" install -q --upgrade "pip==26.3" "setuptools==80.9.0" "wheel==0.45.1"
"$VENV/bin/pip" install -q -e "$ROOT[test]"
echo "$want" > "$stamp"
echo "python: venv installed"
