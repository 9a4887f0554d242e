#!/usr/bin/env bash
# Simulated BMCs for the IPMI collector's tests and benchmark: ipmitool, OpenIPMI's ipmi_sim and
# sdrcomp, and the DCMI extension (lab/bmcsim/dcmi_power.c) built into
# .cache/ipmi-sim/dcmi_power.so. Idempotent: rebuilds only when the C source is newer; the module is
# compiled under a temporary name and renamed, so a build killed part-way is simply redone.
set -euo pipefail
source "$(dirname "$0")/lib/steps.bash"
ROOT="$(step_root)"
SRC="$ROOT/lab/bmcsim/dcmi_power.c"
OUT_DIR="$ROOT/.cache/ipmi-sim"
OUT="$OUT_DIR/dcmi_power.so"

need_pkgs=()
command -v ipmitool >/dev/null 2>&1 || need_pkgs+=(ipmitool)
command -v ipmi_sim >/dev/null 2>&1 || need_pkgs+=(openipmi)
[ -f /usr/include/OpenIPMI/mcserv.h ] || need_pkgs+=(libopenipmi-dev)
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc libc6-dev)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need_pkgs[@]}"
fi

mkdir -p "$OUT_DIR"
if [ ! -f "$OUT" ] || [ "$SRC" -nt "$OUT" ]; then
    # Symbols (ipmi_emu_register_group_extension_handler, ...) resolve at dlopen time
    # against ipmi_sim's libIPMIlanserv, so the module links nothing itself.
    gcc -O2 -Wall -Wextra -Werror -fPIC -shared -o "$OUT.tmp" "$SRC"
    mv -f "$OUT.tmp" "$OUT"
    echo "built $OUT"
fi
