#!/usr/bin/env bash
# Debian packages of the real components the pipeline and its tests run (COMPONENTS.md).
# netperf lives in Debian's non-free component: enable it on the same mirror as main.
set -euo pipefail
PKGS=(prometheus prometheus-alertmanager haproxy socat ipmitool openipmi libopenipmi-dev iptables iperf3
      docker-compose netperf iproute2 build-essential curl ca-certificates openjdk-17-jre-headless maven)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "debian: all ${#PKGS[@]} packages present"; exit 0; }

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing Debian packages (${missing[*]}); run 'make setup' as root or install them" >&2
  exit 1
fi
src=/etc/apt/sources.list.d/opsloop-non-free.sources
if ! grep -rqs "non-free" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  uri=${uri:-http://deb.debian.org/debian}
  cat > "$src" <<SRC
Types: deb
URIs: $uri
Suites: bookworm
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
echo "debian: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
