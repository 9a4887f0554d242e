#!/usr/bin/env bash
# Debian packages of the real components the pipeline and its tests run (systemd: systemd-analyze, with
# which tests/deploy verifies the units in deploy/systemd).
# netperf lives in Debian's non-free component: enable it on the same mirror as main.
set -euo pipefail
PKGS=(prometheus prometheus-alertmanager haproxy socat ipmitool openipmi libopenipmi-dev iptables iperf3
      docker-compose netperf iproute2 build-essential curl ca-certificates openjdk-17-jre-headless maven
      systemd)

source "$(dirname "$0")/lib/steps.bash"
# Called by apt_ensure before it installs anything; the sources file appears whole (temp, then rename).
before_apt_install() {
  rm -f /etc/apt/sources.list.d/opsloop-non-free.sources.tmp   # left by a killed run; grep would count it
  grep -rqs "non-free" /etc/apt/sources.list /etc/apt/sources.list.d/ && return 0
  local src=/etc/apt/sources.list.d/opsloop-non-free.sources uri
  uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  uri=${uri:-http://deb.debian.org/debian}
  printf 'Types: deb\nURIs: %s\nSuites: bookworm\nComponents: non-free\nSigned-By: %s\n' \
    "$uri" /usr/share/keyrings/debian-archive-keyring.gpg > "$src.tmp"
  mv -f "$src.tmp" "$src"
}
apt_ensure debian "${PKGS[@]}"
