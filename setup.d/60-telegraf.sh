#!/usr/bin/env bash
# Telegraf 1.37.2 built from the Go module proxy with only the plugins opsloop's sample configs use
# (collectors/telegraf/), into .cache/telegraf/telegraf. A full build takes ~20 min and 400 MB; the
# "custom" tag plus one tag per plugin takes ~1.5-4 min and ~27 MB. processors.rename maps Telegraf's
# field names onto ours (http_response.2xx -> hrsp_2xx; the DCMI reading -> ipmi_power watts).
# `go install github.com/influxdata/telegraf/cmd/telegraf@v1.37.2` fails on two checksum look-ups, so we
# build from a throwaway module whose go.sum is a copy of Telegraf's own.
# Idempotent: a second run with the same version and tags is a no-op.
# Safe to interrupt anywhere: the binary is built under a temporary name and renamed, the stamp written last.
set -euo pipefail
source "$(dirname "$0")/lib/steps.bash"
ROOT="$(step_root)"
VERSION=1.37.2
TAGS="custom,inputs.ipmi_sensor,inputs.iptables,inputs.ipvs,inputs.haproxy,processors.rename,outputs.kafka,outputs.file,serializers.json"
OUT_DIR="$ROOT/.cache/telegraf"
BIN="$OUT_DIR/telegraf"
STAMP="$OUT_DIR/.built"
WANT="telegraf v$VERSION tags=$TAGS"

if [ -x "$BIN" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "telegraf: $BIN up to date"; exit 0
fi

GO=${GO:-/usr/local/go/bin/go}
[ -x "$GO" ] || GO=$(command -v go || true)
if [ -z "$GO" ]; then
  echo "setup: Go toolchain not found (expected /usr/local/go/bin/go; set GO=/path/to/go)" >&2
  exit 1
fi

# Caches live under .cache/go (git-ignored) so CI can keep them between runs.
export GOMODCACHE="$ROOT/.cache/go/mod" GOCACHE="$ROOT/.cache/go/build"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

MOD="$OUT_DIR/module"
mkdir -p "$MOD"
SRC=$("$GO" mod download -json "github.com/influxdata/telegraf@v$VERSION" \
      | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$SRC" ] || [ ! -f "$SRC/go.sum" ]; then
  echo "setup: could not download github.com/influxdata/telegraf@v$VERSION from the Go module proxy" >&2
  exit 1
fi

# The throwaway main module: requires Telegraf, reuses its checksums and its godebug setting.
go_line=$(grep -m1 '^go ' "$SRC/go.mod")
godebug=$(grep '^godebug ' "$SRC/go.mod" || true)
cat > "$MOD/go.mod" <<MOD
module opsloop.local/telegraf-build

$go_line

$godebug

require github.com/influxdata/telegraf v$VERSION
MOD
cp -f "$SRC/go.sum" "$MOD/go.sum"
chmod u+w "$MOD/go.sum"

echo "telegraf: building v$VERSION with tags $TAGS (~1.5 min)"
(cd "$MOD" && "$GO" build -trimpath -tags "$TAGS" \
   -ldflags "-s -w -X github.com/influxdata/telegraf/internal.Version=$VERSION" \
   -o "$BIN.tmp" github.com/influxdata/telegraf/cmd/telegraf)
rm -f "$STAMP"
mv -f "$BIN.tmp" "$BIN"
write_atomic "$STAMP" "$WANT"
echo "telegraf: built $BIN ($("$BIN" --version))"
