#!/usr/bin/env bash
# Firewall/LVS collectors: ipvsadm (the LVS admin tool; this kernel has no ip_vs, tests use recorded
# output and check the real tool's failure), iptables with both backends, iproute2 for `ip netns`.
set -euo pipefail
PKGS=(ipvsadm iptables iproute2)

source "$(dirname "$0")/lib/steps.bash"
apt_ensure fw "${PKGS[@]}"
