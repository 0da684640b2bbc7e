#!/usr/bin/env bash
# Installs what attnstat's build and tests need, from Debian's packages. Idempotent: prints nothing
# and changes nothing when everything is already there. Needs root (or sudo) only when installing.
#   install-deps.sh          the build and the tests (tests/run.sh)
#   install-deps.sh build    the build and the Debian packages only (deploy/Dockerfile)
set -euo pipefail

# The build; dpkg-dev: dpkg-shlibdeps, with which cpack computes the packages' dependencies.
pkgs=(build-essential cmake ninja-build pkg-config dpkg-dev
      libuv1-dev libprotobuf-c-dev protobuf-c-compiler
      libsqlite3-dev check)
if [ "${1:-}" != build ]; then
  # The tests: sqlite3 and NumPy; the wheel (python3-build, -setuptools, -wheel: PEP 517 with no
  # package index) and the venv it is installed into (python3-venv); the installed package's checks
  # (systemd for systemd-analyze and systemd-sysusers, procps for the unit's /bin/kill, groff-base
  # for rendering the manual pages); clang and its libFuzzer runtime (tests/fuzz.sh).
  pkgs+=(sqlite3 python3 python3-numpy
         python3-build python3-setuptools python3-wheel python3-venv
         systemd procps groff-base
         clang libclang-rt-dev)
fi

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
