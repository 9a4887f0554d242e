#!/usr/bin/env bash
# Apache Kafka 3.9.1 broker jars from Maven Central into .cache/kafka/libs (Debian does not package Kafka).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LIBS="$ROOT/.cache/kafka/libs"
if ls "$LIBS"/kafka_2.13-3.9.1.jar >/dev/null 2>&1 && [ -f "$LIBS/.complete" ]; then
  echo "kafka: jars present"; exit 0
fi
mkdir -p "$LIBS"
mvn -q -B -f "$ROOT/opsloop/stack/kafka-pom.xml" -Dmaven.repo.local="$ROOT/.cache/m2" \
  dependency:copy-dependencies -DoutputDirectory="$LIBS" -DincludeScope=runtime
touch "$LIBS/.complete"
echo "kafka: $(ls "$LIBS" | wc -l) jars in $LIBS"
