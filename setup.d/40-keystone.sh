#!/usr/bin/env bash
# A real OpenStack Keystone (PyPI keystone 30.x) + uWSGI in its own venv, .cache/keystone-venv, so that
# Keystone's many pinned dependencies never conflict with the project's venv. Used by the Keystone
# collector's tests, through the lab's Keystone server (lab/keystone_server).
# Safe to interrupt anywhere: a venv without a working pip or with an interrupted install is rebuilt,
# the stamp is written last.
set -euo pipefail
source "$(dirname "$0")/lib/steps.bash"
# nginx is the S3 front end whose access log the collector parses in tests (nginx-light has map/proxy).
if ! command -v nginx >/dev/null && ! [ -x /usr/sbin/nginx ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light; }
fi
ROOT="$(step_root)"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV="$ROOT/.cache/keystone-venv"
# Bump when the pins below change: the stamp makes a second run a fast no-op.
PINS="keystone==30.0.0 pyuwsgi==2.0.30.post1 dogpile.cache==1.5.0"
stamp="$VENV/.opsloop-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$PINS" ] && [ -x "$VENV/bin/uwsgi" ] && [ -x "$VENV/bin/keystone-manage" ] \
   && venv_usable "$VENV"; then
  echo "keystone: venv up to date"; exit 0
fi
mkdir -p "$ROOT/.cache"
ensure_venv keystone "$VENV" "$PY"
rm -f "$stamp"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VENV/bin/python" -m pip install -q --upgrade "pip==25.3" "setuptools==80.9.0" wheel
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install -q $PINS
"$VENV/bin/python" -m pip check >/dev/null || { "$VENV/bin/python" -m pip check >&2; exit 1; }
# The lab's Keystone server (lab/keystone_server) relies on these: the WSGI app imports, the in-process
# cache backend resolves, and uWSGI has the http router (not every uWSGI build has it).
"$VENV/bin/python" -W ignore - <<'EOF'
import dogpile.cache
region = dogpile.cache.make_region().configure("dogpile.cache.memory")
region.set("probe", 1)
assert region.get("probe") == 1, "dogpile.cache.memory does not work"
import keystone.server.wsgi  # noqa: F401  (keystone.wsgi.api needs a config dir, so import its parent)
EOF
plugins=$("$VENV/bin/uwsgi" --plugins-list 2>&1 || true)  # it exits non-zero after listing
grep -qx http <<<"$plugins" || { echo "keystone: uwsgi in $VENV has no http router plugin" >&2; exit 1; }
venv_installed "$VENV" "$stamp" "$PINS"
echo "keystone: installed $PINS into $VENV"
