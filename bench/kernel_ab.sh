#!/usr/bin/env bash
# kernel_ab.sh — one kernel change measured the way bench/kernel_notes.md's rounds are: the kernels
# before (A) and after (B) built side by side from the same sources, B checked first
# (tests/test_stats_cuda on every variant, compute-sanitizer on the variants named), then
# bench/bench_kernel.py alternating A and B, and one table of the default path's medians, A beside B.
#
# Here, in the repository (git needed; the GPU machine's copy has no usable history):
#   bench/kernel_ab.sh prepare A B      A, B: revisions; B may also be "worktree" (the working tree,
#                                       uncommitted changes too) or "A+PATCHFILE" (A with a patch)
#   -> .ab/A.tar.gz, .ab/B.tar.gz (ignored by git; carry .ab and .devdeps to the GPU machine)
# There (from the repository root, after `source .devdeps/env.sh &&` where CMake needs it):
#   bench/kernel_ab.sh run [OUTDIR]     OUTDIR default $OUT or ./ab-out; logs and summary.md there
# Environment of `run`:
#   AB_ONLY=3,9,2,4,1         bench_kernel.py's shapes (ATTNSTAT_BENCH_ONLY)
#   AB_VARIANTS=10,11         also time these variants in every run (ATTNSTAT_BENCH_VARIANTS)
#   AB_RUNS=2                 rounds of A, B
#   AB_SANITIZE=10,11         compute-sanitizer racecheck and memcheck on B's variants ("" skips)
#   AB_MAXONLY=1              one more round asking for the max logit alone (AB_VARIANTS' too)
#   AB_TEST=1                 test_stats_cuda on B, every variant (0 skips: timing only)
#   AB_REUSE=1                keep the last run's sources and builds (same machine, still warm)
#   AB_PROFILE=V:SHAPE[:WANT],..  Nsight Compute on variant V at bench/profile_kernel.py's SHAPE
#                             (WANT: PROFILE_WANT, e.g. max_logit), A then B, both built with
#                             -lineinfo; logs/prof{A,B}N.src.csv (the source page with SASS, N the
#                             spec's place in the list) and .details.txt. By region, back in the
#                             repository: bench/kernel_ab.sh regions OUTDIR
#   AB_SASS=REGEX             cuobjdump -sass of the Hopper kernels whose mangled names match
#                             (e.g. 'stats_wsp_kernelILi64ELb0ELi0ELi3ELi64ELi0ELi1E': variant 11,
#                             d64, bf16, FOLD_BASE) from A and B, into logs/sassA.txt, sassB.txt
# B is timed even when a check fails, and the summary says which failed: merge only when none did.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}

prepare() {
    local a=$1 b=$2
    mkdir -p .ab # ignored (.gitignore): the device tool carries it only when asked to
    git archive --format=tar.gz -o .ab/A.tar.gz "$a" || return 1
    case "$b" in
    worktree)
        local idx tree
        idx=$(mktemp) && cp .git/index "$idx" || return 1
        GIT_INDEX_FILE=$idx git add -A -- . ':!.ab' ':!.devdeps' >/dev/null 2>&1
        tree=$(GIT_INDEX_FILE=$idx git write-tree) && rm -f "$idx" &&
            git archive --format=tar.gz -o .ab/B.tar.gz "$tree" || return 1 ;;
    *+*)
        local rev=${b%%+*} patch=${b#*+} wt
        wt=$(mktemp -d) && git archive "$rev" | tar x -C "$wt" &&
            (cd "$wt" && patch -p1 -s) < "$patch" &&
            tar czf .ab/B.tar.gz -C "$wt" . && rm -rf "$wt" || return 1 ;;
    *)
        git archive --format=tar.gz -o .ab/B.tar.gz "$b" || return 1 ;;
    esac
    printf 'A %s\nB %s\n' "$(git rev-parse --short "$a")" "$b" > .ab/what.txt
    echo "kernel_ab: .ab/A.tar.gz ($a) and .ab/B.tar.gz ($b) ready; carry .ab and .devdeps"
}

run() {
    local out=${1:-${OUT:-ab-out}} root=$PWD t0 failed=()
    mkdir -p "$out/logs"
    local L=$out/logs
    [ -f .ab/A.tar.gz ] && [ -f .ab/B.tar.gz ] || { echo "kernel_ab: run prepare first" >&2; return 2; }
    t0=$(date +%s)
    for t in A B; do
        if [ "${AB_REUSE:-0}" = 1 ] && [ -d "/tmp/ab-build-$t" ]; then continue; fi
        rm -rf "/tmp/ab-src-$t" && mkdir -p "/tmp/ab-src-$t" && tar xzmf ".ab/$t.tar.gz" -C "/tmp/ab-src-$t"
        (cd "/tmp/ab-src-$t" && BENCH_LINEINFO=$([ -n "${AB_PROFILE:-}" ] && echo 1 || echo 0) \
            BUILD=/tmp/ab-build-$t bench/bench_kernel.sh build) > "$L/build$t.log" 2>&1 &
    done
    wait
    for t in A B; do
        [ -f "/tmp/ab-build-$t/kernels/libattnstat_cuda.so" ] ||
            [ -f "/tmp/ab-build-$t/direct/libattnstat_cuda.so" ] ||
            { echo "kernel_ab: build $t failed"; tail -20 "$L/build$t.log"; return 1; }
    done
    echo "kernel_ab: built in $(( $(date +%s) - t0 )) s"
    lib() { local b=/tmp/ab-build-$1; [ -f "$b/kernels/libattnstat_cuda.so" ] &&
            echo "$b/kernels/libattnstat_cuda.so" || echo "$b/direct/libattnstat_cuda.so"; }
    tst() { local b=/tmp/ab-build-$1; [ -x "$b/tests/test_stats_cuda" ] &&
            echo "$b/tests/test_stats_cuda" || echo "$b/direct/test_stats_cuda"; }
    if [ -n "${AB_SASS:-}" ]; then
        for t in A B; do
            find "/tmp/ab-build-$t" -name 'ws_sm90*.o' | sort | while read -r o; do
                cuobjdump -sass "$o" | awk -v re="$AB_SASS" '/Function : /{keep = ($0 ~ re)} keep'
            done > "$L/sass$t.txt"
            echo "kernel_ab: SASS of $t: $(grep -c 'Function : ' "$L/sass$t.txt") functions," \
                "$(grep -cE '^ +/\*[0-9a-f]{4,}\*/' "$L/sass$t.txt") instructions"
        done
    fi
    if [ "${AB_TEST:-1}" = 1 ]; then
        (cd /tmp/ab-src-B && ATTNSTAT_TEST_VARIANTS=1 "$(tst B)") > "$L/testB.log" 2>&1 ||
            failed+=("test_stats_cuda")
        echo "kernel_ab: test_stats_cuda on B: $(tail -1 "$L/testB.log")"
    fi
    local v tool
    for v in $(echo "${AB_SANITIZE-10,11}" | tr ',' ' '); do
        for tool in racecheck memcheck; do
            (cd /tmp/ab-src-B && ATTNSTAT_TEST_WG_ONLY=$v compute-sanitizer --tool $tool \
                --error-exitcode 9 "$(tst B)") > "$L/$tool$v.log" 2>&1 || failed+=("$tool $v")
            echo "kernel_ab: $tool on B's variant $v: $(grep -E 'SUMMARY' "$L/$tool$v.log" | tail -1)"
        done
    done
    local r
    for r in $(seq "${AB_RUNS:-2}"); do
        for t in A B; do
            (cd "/tmp/ab-src-$t" && ATTNSTAT_BENCH_ONLY=${AB_ONLY:-3,9,2,4,1} \
                ATTNSTAT_BENCH_VARIANTS=${AB_VARIANTS:-} python3 bench/bench_kernel.py "$(lib $t)") \
                > "$L/bench${t}_$r.log" 2>&1 || failed+=("bench $t round $r")
        done
    done
    if [ "${AB_MAXONLY:-0}" = 1 ]; then
        for t in A B; do
            (cd "/tmp/ab-src-$t" && ATTNSTAT_BENCH_MAXONLY=1 ATTNSTAT_BENCH_ONLY=${AB_ONLY:-3,9,2,4,1} \
                ATTNSTAT_BENCH_VARIANTS=${AB_VARIANTS:-} \
                ATTNSTAT_BENCH_VARIANTS_WANT=${AB_VARIANTS:+max_logit} \
                python3 bench/bench_kernel.py "$(lib $t)") > "$L/max${t}.log" 2>&1 ||
                failed+=("max-only bench $t")
        done
    fi
    local spec pv ps pw n=0 tag
    for spec in $(echo "${AB_PROFILE:-}" | tr ',' ' '); do
        IFS=: read -r pv ps pw <<< "$spec"
        n=$((n + 1))
        for t in A B; do
            tag=$t$n
            (cd "/tmp/ab-src-$t" && PROFILE_WANT=${pw:-} ncu -f -o "/tmp/ab-prof$tag" \
                --section SourceCounters --section WarpStateStats --section SchedulerStats \
                --section InstructionStats --section SpeedOfLight -k "regex:stats_(wg|ws|mma)" \
                python3 bench/profile_kernel.py "$(lib $t)" "$pv" "$ps") > "$L/prof$tag.log" 2>&1 &&
                ncu -i "/tmp/ab-prof$tag.ncu-rep" --page details > "$L/prof$tag.details.txt" 2>&1 &&
                ncu -i "/tmp/ab-prof$tag.ncu-rep" --page source --csv --print-source cuda,sass \
                    > "$L/prof$tag.src.csv" 2>"$L/prof$tag.src.err" || failed+=("profile $tag")
            echo "$spec" > "$L/prof$tag.spec"
            echo "kernel_ab: profile $spec of $t:" \
                "$(grep -m1 -E 'Duration' "$L/prof$tag.details.txt")"
        done
    done
    {
        echo "# kernel A/B, $(date -u '+%Y-%m-%d %H:%M UTC')"
        cat .ab/what.txt 2>/dev/null
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
        echo
        python3 "$root/bench/kernel_ab_table.py" "$L" "${AB_RUNS:-2}"
        echo
        if [ ${#failed[@]} -eq 0 ]; then echo "checks: all passed"; else
            printf 'checks FAILED: %s\n' "${failed[*]}"; fi
    } > "$out/summary.md"
    cat "$out/summary.md"
    [ ${#failed[@]} -eq 0 ]
}

# bench/ncu_regions.py on a run's profiles, here (ctags; the GPU machine has none): each tree from
# .ab/{A,B}.tar.gz, so that the source lines are the profiled commit's.
regions() {
    local dir=${1:?usage: bench/kernel_ab.sh regions OUTDIR} t root csv tag
    ls "$dir"/logs/prof*.src.csv > /dev/null 2>&1 ||
        { echo "kernel_ab: no profiles in $dir/logs" >&2; return 1; }
    for t in A B; do
        root=$(mktemp -d) && tar xzf ".ab/$t.tar.gz" -C "$root" || return 1
        for csv in "$dir/logs/prof$t"*.src.csv; do
            tag=$(basename "$csv" .src.csv)
            echo "## $t ($(sed -n "s/^$t //p" .ab/what.txt 2>/dev/null))," \
                "$(cat "${csv%.src.csv}.spec" 2>/dev/null)"
            grep -m1 -E 'Duration' "${csv%.src.csv}.details.txt" 2>/dev/null
            python3 bench/ncu_regions.py "$csv" --root "$root" --markdown
        done
        rm -rf "$root"
    done
}

case "$mode" in
regions) regions "${2:-}" ;;
prepare) [ $# -eq 3 ] || { echo "usage: bench/kernel_ab.sh prepare A B" >&2; exit 2; }; prepare "$2" "$3" ;;
run) shift; run "$@" ;;
*) sed -n '2,28p' "$0" >&2; exit 2 ;;
esac
