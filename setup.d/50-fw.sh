#!/usr/bin/env bash
# Firewall/LVS collectors: ipvsadm (the LVS admin tool; this kernel has no ip_vs, tests use recorded
# output and check the real tool's failure), iptables with both backends, iproute2 for `ip netns`.
set -euo pipefail
PKGS=(ipvsadm iptables iproute2)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "fw: all ${#PKGS[@]} packages present"; exit 0; }

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing Debian packages (${missing[*]}); run 'make setup' as root or install them" >&2
  exit 1
fi
echo "fw: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
