#!/usr/bin/env bash
# The README's run command. On a fresh machine: installs the dependencies, builds attnstat into
# build/, starts attnstatd on a private socket and database in a temporary directory, runs the
# synthetic training process (attnstat-synth: some heads drift into entropy collapse, one head's
# logits grow past the ceiling), then shows the runs, a trend, the layer x head heatmap of the last
# step and the alerts that fired, and stops the daemon. Every number comes from the computation.
#   ATTNSTAT_QUICKSTART_STEPS=N   steps of the synthetic run (default 300)
#   ATTNSTAT_QUICKSTART_KEEP=1    keep the temporary directory (database, log) afterwards
#   BUILD_DIR=DIR                 build directory (default build)
set -euo pipefail
cd "$(dirname "$0")/.."

steps=${ATTNSTAT_QUICKSTART_STEPS:-300}
build=${BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)

say() { printf '\n\033[1m== %s ==\033[0m\n' "$*"; }

say "dependencies"
bash deploy/install-deps.sh
echo "ok"

say "build ($build)"
buildlog=$(mktemp "${TMPDIR:-/tmp}/attnstat-build.XXXXXX")
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
       cmake --build "$build" -j "$jobs" --target attnstatd attnstat_cli attnstat_synth; } \
     >"$buildlog" 2>&1; then
  echo "quickstart: the build failed; the end of its output ($buildlog):" >&2
  tail -n 40 "$buildlog" >&2
  exit 1
fi
tail -n 1 "$buildlog"
rm -f "$buildlog"

daemon="$build/daemon/attnstatd"
cli="$build/client/attnstat"
synth="$build/client/attnstat-synth"
for b in "$daemon" "$cli" "$synth"; do
  [ -x "$b" ] || { echo "quickstart: $b was not built" >&2; exit 1; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/attnstat-quickstart.XXXXXX")
sock="$tmp/attnstatd.sock"
db="$tmp/attnstat.db"
log="$tmp/attnstatd.log"
dpid=""

stop_daemon() {
  if [ -n "$dpid" ] && kill -0 "$dpid" 2>/dev/null; then
    kill -TERM "$dpid"
    local rc=0
    wait "$dpid" || rc=$?
    dpid=""
    return $rc
  fi
  dpid=""
}
cleanup() {
  local rc=$?
  stop_daemon || true
  if [ "${ATTNSTAT_QUICKSTART_KEEP:-0}" = 1 ] || [ $rc -ne 0 ]; then
    echo "quickstart: kept $tmp (database, daemon log)" >&2
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "start attnstatd (socket $sock, database $db)"
"$daemon" --socket "$sock" --db "$db" --log-level info >"$log" 2>&1 &
dpid=$!
for _ in $(seq 1 100); do
  [ -S "$sock" ] && break
  kill -0 "$dpid" 2>/dev/null || { echo "quickstart: attnstatd exited; its log:" >&2; cat "$log" >&2; exit 1; }
  sleep 0.1
done
[ -S "$sock" ] || { echo "quickstart: attnstatd did not create $sock in 10 s; its log:" >&2; cat "$log" >&2; exit 1; }
"$cli" --socket "$sock" status

# A second terminal would run `attnstat watch`; here it runs in the background into a file.
"$cli" --socket "$sock" watch >"$tmp/watch.out" 2>&1 &
wpid=$!

say "synthetic training run: $steps steps, 4 layers x 8 heads, N=256, D=64, bf16"
"$synth" --socket "$sock" --run quickstart --steps "$steps" --seed 1

sleep 0.5
kill -INT "$wpid" 2>/dev/null || true
wait "$wpid" || { echo "quickstart: attnstat watch failed:" >&2; cat "$tmp/watch.out" >&2; exit 1; }
say "attnstat watch (ran during training, stopped with Ctrl-C)"
cat "$tmp/watch.out"

say "attnstat status (after the run)"
"$cli" --socket "$sock" status

say "attnstat runs"
"$cli" --db "$db" runs

every=$(( steps / 12 > 0 ? steps / 12 : 1 ))
say "attnstat trend --run quickstart --layer 1 --head 3 --every $every   (a collapsing head)"
"$cli" --db "$db" trend --run quickstart --layer 1 --head 3 --every "$every"

say "attnstat trend --run quickstart --layer 3 --head 6 --every $every   (logits growing)"
"$cli" --db "$db" trend --run quickstart --layer 3 --head 6 --every "$every"

say "attnstat heads --run quickstart   (last step: normalised entropy)"
"$cli" --db "$db" heads --run quickstart

say "attnstat heads --run quickstart --metric max_logit"
"$cli" --db "$db" heads --run quickstart --metric max_logit

say "attnstat alerts --run quickstart"
"$cli" --db "$db" alerts --run quickstart

say "stop attnstatd"
stop_daemon
echo "attnstatd stopped cleanly; its log:"
tail -n 4 "$log"

say "history works with the daemon down: attnstat alerts --run quickstart --rule logit_ceiling"
"$cli" --db "$db" alerts --run quickstart --rule logit_ceiling
