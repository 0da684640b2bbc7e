#!/usr/bin/env bash
# Installs what attnstat's build and tests need, from Debian's packages. Idempotent: prints nothing
# and changes nothing when everything is already there. Needs root (or sudo) only when installing.
set -euo pipefail

pkgs=(build-essential cmake ninja-build pkg-config
      libuv1-dev libprotobuf-c-dev protobuf-c-compiler
      libsqlite3-dev sqlite3 check python3 python3-numpy
      clang libclang-rt-dev)  # clang + libFuzzer: the fuzz run of tests/run.sh (tests/fuzz.sh)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
