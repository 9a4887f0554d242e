#!/usr/bin/env bash
# Elasticsearch 8.19.21 (integ-test zip: core modules only, no X-Pack) from Maven Central into
# .cache/elasticsearch/elasticsearch-8.19.21. Debian does not package Elasticsearch; the tests and
# `opsloop audit` index the audit trail into it. It refuses to run as root, so the stack runs it as
# `nobody` (opsloop/stack/elasticsearch.py): the tree is made world-readable here.
# Safe to interrupt anywhere: the zip is checked before use (a damaged one is fetched again) and unpacked
# into a temporary folder that is renamed into place with its completion mark inside.
set -euo pipefail
source "$(dirname "$0")/lib/steps.bash"
ROOT="$(step_root)"
VERSION=8.19.21
CACHE="$ROOT/.cache/elasticsearch"
HOME_DIR="$CACHE/elasticsearch-$VERSION"
if [ -x "$HOME_DIR/bin/elasticsearch" ] && [ -f "$HOME_DIR/.complete" ]; then
  echo "elasticsearch: $VERSION present"; exit 0
fi
command -v unzip >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends unzip
command -v setpriv >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends util-linux
mkdir -p "$CACHE"
ZIP="$CACHE/elasticsearch-$VERSION.zip"
if [ -s "$ZIP" ] && ! unzip -tqq "$ZIP" >/dev/null 2>&1; then
  echo "elasticsearch: $ZIP is damaged; fetching it again"
  rm -f "$ZIP"
fi
if [ ! -s "$ZIP" ]; then
  rm -rf "$CACHE.tmp"
  mvn -q -B -Dmaven.repo.local="$ROOT/.cache/m2" dependency:copy \
    -Dartifact="org.elasticsearch.distribution.integ-test-zip:elasticsearch:$VERSION:zip" \
    -DoutputDirectory="$CACHE.tmp"
  mv "$CACHE.tmp/elasticsearch-$VERSION.zip" "$ZIP"
  rmdir "$CACHE.tmp" 2>/dev/null || true
fi
UNPACK="$CACHE/.unpack"
rm -rf "$UNPACK"
mkdir -p "$UNPACK" && chmod 755 "$UNPACK"
unzip -q -o "$ZIP" -d "$UNPACK"
# nobody must read the distribution (the data dir is created per run, owned by nobody).
chmod -R a+rX "$UNPACK/elasticsearch-$VERSION"
if ! setpriv --reuid=nobody --regid=nogroup --clear-groups test -r "$UNPACK/elasticsearch-$VERSION/bin/elasticsearch"; then
  # A parent directory (e.g. a checkout under /root) is not traversable: grant traverse only (o+x, no listing).
  dir="$CACHE"
  while [ "$dir" != "/" ]; do
    if [ "$(( 0$(stat -c %a "$dir") & 1 ))" -eq 0 ]; then chmod o+x "$dir"; echo "elasticsearch: chmod o+x $dir"; fi
    dir="$(dirname "$dir")"
  done
fi
touch "$UNPACK/elasticsearch-$VERSION/.complete"
rm -rf "$HOME_DIR"
mv "$UNPACK/elasticsearch-$VERSION" "$HOME_DIR"
rmdir "$UNPACK"
echo "elasticsearch: $VERSION in $HOME_DIR"
