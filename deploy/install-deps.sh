#!/usr/bin/env bash
# Installs what attnstat's build and tests need, from Debian's packages. Idempotent: prints nothing
# and changes nothing when everything is already there. Needs root (or sudo) only when installing.
#   install-deps.sh          the build and the tests (tests/run.sh)
#   install-deps.sh build    the build and the Debian packages only (deploy/Dockerfile)
# The monitoring stack the cluster tests run (Prometheus, Alertmanager: tests/test_deploy.py,
# tests/test_cluster.py) is installed last and may fail without failing this script: those tests
# then report themselves skipped, saying the packages could not be installed.
set -euo pipefail

# The build; dpkg-dev: dpkg-shlibdeps, with which cpack computes the packages' dependencies.
pkgs=(build-essential cmake ninja-build pkg-config dpkg-dev
      libuv1-dev libprotobuf-c-dev protobuf-c-compiler
      libsqlite3-dev check)
if [ "${1:-}" != build ]; then
  # The tests: sqlite3, NumPy and PyYAML (the checks of deploy/'s files); the wheel (python3-build,
  # -setuptools, -wheel: PEP 517 with no package index) and the venv it is installed into
  # (python3-venv); the installed package's checks
  # (systemd for systemd-analyze and systemd-sysusers, procps for the unit's /bin/kill, groff-base
  # for rendering the manual pages, lintian for Debian's checks of the packages); clang and its
  # libFuzzer runtime (tests/fuzz.sh).
  pkgs+=(sqlite3 python3 python3-numpy python3-yaml
         python3-build python3-setuptools python3-wheel python3-venv
         systemd procps groff-base lintian
         clang libclang-rt-dev)
fi

# The cluster tests: promtool, amtool and the servers themselves. Their services are not started
# (policy-rc.d below): the tests run their own instances.
monitoring=()
[ "${1:-}" != build ] && monitoring=(prometheus prometheus-alertmanager)

missing_of() {
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      echo "$p"
    fi
  done
}
mapfile -t missing < <(missing_of "${pkgs[@]}")
mapfile -t missing_mon < <(missing_of "${monitoring[@]}")
[ ${#missing[@]} -eq 0 ] && [ ${#missing_mon[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    [ ${#missing[@]} -eq 0 ] || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
    echo "install-deps: cannot install ${missing_mon[*]} (not root, no sudo): the cluster tests will be skipped" >&2
    exit 0
  fi
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq || { [ ${#missing[@]} -eq 0 ] || exit 1; }
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#missing_mon[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing_mon[*]}"
  # Keep their services from starting where an init system would (containers have none anyway).
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod 755 "$policy" && made_policy=1
  fi
  if ! $sudo apt-get install -y -qq --no-install-recommends "${missing_mon[@]}" >/dev/null; then
    echo "install-deps: could not install ${missing_mon[*]}: the cluster tests will be skipped" >&2
  fi
  [ $made_policy -eq 1 ] && $sudo rm -f "$policy"
fi
exit 0
