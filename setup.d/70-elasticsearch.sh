#!/usr/bin/env bash
# Elasticsearch 8.19.21 (integ-test zip: core modules only, no X-Pack) from Maven Central into
# .cache/elasticsearch/elasticsearch-8.19.21. Debian does not package Elasticsearch; the tests and
# `opsloop audit` index the audit trail into it. It refuses to run as root, so the stack runs it as
# `nobody` (opsloop/stack/elasticsearch.py): the tree is made world-readable here.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
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
if [ ! -s "$ZIP" ]; then
  mvn -q -B -Dmaven.repo.local="$ROOT/.cache/m2" dependency:copy \
    -Dartifact="org.elasticsearch.distribution.integ-test-zip:elasticsearch:$VERSION:zip" \
    -DoutputDirectory="$CACHE.tmp"
  mv "$CACHE.tmp/elasticsearch-$VERSION.zip" "$ZIP"
  rmdir "$CACHE.tmp" 2>/dev/null || true
fi
rm -rf "$HOME_DIR"
unzip -q -o "$ZIP" -d "$CACHE"
# nobody must read the distribution (the data dir is created per run, owned by nobody).
chmod -R a+rX "$HOME_DIR"
if ! setpriv --reuid=nobody --regid=nogroup --clear-groups test -r "$HOME_DIR/bin/elasticsearch"; then
  # A parent directory (e.g. a checkout under /root) is not traversable: grant traverse only (o+x, no listing).
  dir="$(dirname "$HOME_DIR")"
  while [ "$dir" != "/" ]; do
    if [ "$(( 0$(stat -c %a "$dir") & 1 ))" -eq 0 ]; then chmod o+x "$dir"; echo "elasticsearch: chmod o+x $dir"; fi
    dir="$(dirname "$dir")"
  done
fi
touch "$HOME_DIR/.complete"
echo "elasticsearch: $VERSION in $HOME_DIR"
