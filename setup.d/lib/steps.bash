# Shared by the set-up steps (sourced, not run: `make setup` runs only setup.d/*.sh).
# Every step checks its result, not the existence of its folder, and survives being killed at any point:
# results are written under a temporary name and renamed, or verified and rebuilt when broken.

# The checkout the steps install into; OPSLOOP_ROOT points the steps at a scratch copy (the set-up tests).
step_root() { echo "${OPSLOOP_ROOT:-$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)}"; }

# write_atomic FILE TEXT: FILE holds TEXT or its old content, never a torn line (a stamp written last).
write_atomic() { printf '%s\n' "$2" > "$1.tmp.$$" && mv -f "$1.tmp.$$" "$1"; }

# venv_usable VENV: its interpreter runs and has pip (an interrupted `python -m venv` leaves bin/python
# without pip, and every later install then failed with ".venv/bin/pip: No such file or directory").
venv_usable() { "$1/bin/python" -c 'import sys' >/dev/null 2>&1 && "$1/bin/python" -m pip --version >/dev/null 2>&1; }

# ensure_venv LABEL VENV PYTHON: a usable virtualenv at VENV, rebuilt from scratch when it is not, marked
# as being installed into until venv_installed. A venv whose install was interrupted is rebuilt too:
# pip killed while replacing itself leaves its old version stashed as '~ip-…' beside a half-written new
# one that still answers --version and counts as installed, and only `pip check` then fails on it.
ensure_venv() {
  local label=$1 venv=$2 py=$3
  if [ -e "$venv" ] && { [ -e "$venv/.opsloop-installing" ] || ! venv_usable "$venv"; }; then
    echo "$label: $venv is incomplete (an interrupted set-up?); rebuilding it"
    rm -rf "$venv"
  fi
  [ -e "$venv" ] || "$py" -m venv "$venv"
  venv_usable "$venv" || { echo "setup: $label: '$py -m venv $venv' left no working pip" >&2; return 1; }
  : > "$venv/.opsloop-installing"
}

# venv_installed VENV STAMP TEXT: the installs into VENV finished: its marker goes, then STAMP holds TEXT
# (in that order: a kill between the two only repeats the installs, which then find everything in place).
venv_installed() { rm -f "$1/.opsloop-installing" && write_atomic "$2" "$3"; }

# apt_ensure LABEL PKG...: the Debian packages installed. "install ok installed" is dpkg's own result
# check; a dpkg run killed part-way (half-installed/unpacked packages) is finished first with
# `dpkg --configure -a`, which apt-get would otherwise refuse to work around. A step may define
# before_apt_install (run as root, only when something is missing).
apt_ensure() {
  local label=$1; shift
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && { echo "$label: all $# packages present"; return 0; }
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages (${missing[*]}); run 'make setup' as root or install them" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if [ -n "$(dpkg --audit 2>/dev/null)" ]; then
    echo "$label: finishing an interrupted dpkg run (dpkg --configure -a)"
    dpkg --configure -a
  fi
  if declare -F before_apt_install >/dev/null; then before_apt_install; fi
  echo "$label: installing ${missing[*]}"
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
}
