#!/usr/bin/env bash
# Log shippers for journald -> Elasticsearch, built from the Go module proxy into .cache/beats/:
#  * Filebeat 7.17.29 with the journald input (the `withjournald` build tag; without it Filebeat says
#    "No such input type exist: 'journald'"). Cold build ~2.5 min and ~0.8 GB RAM, 73 MB binary.
#  * Journalbeat 7.15.2, the last release before Elastic removed it, for sites that still run it (~2 min).
# Both need cgo and libsystemd-dev (they read journal files through sd-journal). The tests write real
# journal files with systemd-journal-remote (no journald needed), so that package is installed too.
# The Go module and build caches (~1.7 GB) are temporary and deleted after the build.
# Idempotent: skipped when each binary is present, runs, and reports the wanted version.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT_DIR="$ROOT/.cache/beats"
FILEBEAT_VERSION=7.17.29
JOURNALBEAT_VERSION=7.15.2

# "<name> <version>": the binary runs and says its version (not only that the file exists).
beat_ok() {
  local bin="$OUT_DIR/$1" want="$2"
  [ -x "$bin" ] && "$bin" version 2>/dev/null | grep -q "version $want "
}

PKGS=(libsystemd-dev systemd-journal-remote)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages (${missing[*]}); run 'make setup' as root or install them" >&2
    exit 1
  fi
  echo "beats: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; }
fi

mkdir -p "$OUT_DIR"
# One build at a time (two `make setup` at once would build twice into the same files).
exec 9>"$OUT_DIR/.lock"
flock 9
# Left by a build that was killed (SIGKILL skips the clean-up below); no other build runs now.
for stale in "$OUT_DIR"/build.* "$OUT_DIR"/*.tmp; do
  [ -e "$stale" ] || continue
  echo "beats: removing $stale, left by an interrupted build"
  chmod -R u+w "$stale" 2>/dev/null || true
  rm -rf "$stale"
done

if beat_ok filebeat "$FILEBEAT_VERSION" && beat_ok journalbeat "$JOURNALBEAT_VERSION"; then
  echo "beats: filebeat $FILEBEAT_VERSION and journalbeat $JOURNALBEAT_VERSION in $OUT_DIR"; exit 0
fi

GO=${GO:-/usr/local/go/bin/go}
[ -x "$GO" ] || GO=$(command -v go || true)
if [ -z "$GO" ]; then
  echo "setup: Go toolchain not found (expected /usr/local/go/bin/go; set GO=/path/to/go)" >&2
  exit 1
fi

TMP=$(mktemp -d "$OUT_DIR/build.XXXXXX")
# -modcacherw: the module cache is writable, so the trap can delete it.
trap 'chmod -R u+w "$TMP" 2>/dev/null; rm -rf "$TMP" "$OUT_DIR"/*.tmp' EXIT
trap 'exit 130' INT TERM HUP
export GOMODCACHE="$TMP/mod" GOCACHE="$TMP/build" GOPATH="$TMP/gopath"
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -modcacherw" CGO_ENABLED=1

# build <binary> <version> <package dir inside the beats module>
build() {
  local name="$1" version="$2" pkg="$3" src start
  if beat_ok "$name" "$version"; then echo "beats: $name $version present"; return; fi
  start=$(date +%s)
  src=$("$GO" mod download -json "github.com/elastic/beats/v7@v$version" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  if [ -z "$src" ] || [ ! -d "$src/$pkg" ]; then
    echo "setup: could not download github.com/elastic/beats/v7@v$version from the Go module proxy" >&2
    exit 1
  fi
  echo "beats: building $name $version (cgo, a few minutes on a cold cache)"
  (cd "$src" && "$GO" build -tags withjournald -ldflags '-s -w' -o "$OUT_DIR/$name.tmp" "./$pkg")
  mv -f "$OUT_DIR/$name.tmp" "$OUT_DIR/$name"
  if ! beat_ok "$name" "$version"; then
    echo "setup: $OUT_DIR/$name was built but does not report version $version" >&2
    "$OUT_DIR/$name" version >&2 || true
    exit 1
  fi
  echo "beats: built $name in $(( $(date +%s) - start )) s: $("$OUT_DIR/$name" version)"
}

build filebeat "$FILEBEAT_VERSION" filebeat
build journalbeat "$JOURNALBEAT_VERSION" journalbeat
