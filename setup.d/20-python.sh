#!/usr/bin/env bash
# The project's virtualenv with pinned dependencies; re-installs only when pyproject.toml changed.
# Safe to interrupt anywhere: a venv without a working pip or with an interrupted install is rebuilt,
# the stamp is written last (whole), and the up-to-date check also runs the interpreter, pip and an
# import of the project.
set -euo pipefail
source "$(dirname "$0")/lib/steps.bash"
ROOT="$(step_root)"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV="$ROOT/.venv"
# What must import once installed: the project's top-level package (a scratch test project names its own).
IMPORT_CHECK=${OPSLOOP_IMPORT_CHECK:-opsloop.cli}
stamp="$VENV/.opsloop-installed"
# setup.py too: it holds the package-dir mapping an editable install bakes in.
files=("$ROOT/pyproject.toml"); [ -f "$ROOT/setup.py" ] && files+=("$ROOT/setup.py")   # a scratch project has none
want=$(cat "${files[@]}" | sha256sum | cut -d' ' -f1)
installed() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && venv_usable "$VENV" \
              && "$VENV/bin/python" -c "import $IMPORT_CHECK" >/dev/null 2>&1; }
if installed; then
  echo "python: venv up to date"; exit 0
fi
ensure_venv python "$VENV" "$PY"
rm -f "$stamp"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VENV/bin/python" -m pip install -q --upgrade "pip==26.3" "setuptools==80.9.0" "wheel==0.45.1"
"$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
# A broken requirement among the pins fails here, not at the first import.
"$VENV/bin/python" -m pip check >/dev/null || { "$VENV/bin/python" -m pip check >&2; exit 1; }
"$VENV/bin/python" -c "import $IMPORT_CHECK"
venv_installed "$VENV" "$stamp" "$want"
echo "python: venv installed"
