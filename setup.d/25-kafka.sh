#!/usr/bin/env bash
# Apache Kafka 3.9.1 broker jars from Maven Central into .cache/kafka/libs (Debian does not package Kafka).
# Safe to interrupt anywhere: the jars are copied into a fresh temporary folder, checked (every jar a
# readable zip, the broker jar among them), stamped with the POM's hash and only then renamed into place.
set -euo pipefail
source "$(dirname "$0")/lib/steps.bash"
ROOT="$(step_root)"
POM="$ROOT/opsloop/stack/kafka-pom.xml"
LIBS="$ROOT/.cache/kafka/libs"
want="$(sha256sum "$POM" | cut -d' ' -f1)"
if [ -f "$LIBS/kafka_2.13-3.9.1.jar" ] && [ "$(cat "$LIBS/.complete" 2>/dev/null)" = "$want" ]; then
  echo "kafka: jars present"; exit 0
fi
TMP="$LIBS.tmp"
rm -rf "$TMP"
mkdir -p "$TMP"
mvn -q -B -f "$POM" -Dmaven.repo.local="$ROOT/.cache/m2" \
  dependency:copy-dependencies -DoutputDirectory="$TMP" -DincludeScope=runtime
[ -f "$TMP/kafka_2.13-3.9.1.jar" ] || { echo "setup: kafka: broker jar missing after the copy" >&2; exit 1; }
# Every jar readable (Maven downloads to a temporary name, but a damaged local repository is named here).
python3 - "$TMP"/*.jar <<'PY'
import sys, zipfile
bad = []
for jar in sys.argv[1:]:
    try:
        with zipfile.ZipFile(jar) as z:
            if z.testzip() is not None:
                bad.append(jar)
    except (OSError, zipfile.BadZipFile):
        bad.append(jar)
if bad:
    sys.exit(f"setup: kafka: unreadable jars {bad}; delete them from .cache/m2 and run make setup again")
PY
write_atomic "$TMP/.complete" "$want"
rm -rf "$LIBS.old"
[ -e "$LIBS" ] && mv "$LIBS" "$LIBS.old"
mv "$TMP" "$LIBS"
rm -rf "$LIBS.old"
echo "kafka: $(ls "$LIBS" | wc -l) jars in $LIBS"
