#!/usr/bin/env bash
# kernel_ab.sh — kernel changes measured the way bench/kernel_notes.md's rounds are: the kernels
# before (A) and after (B, and C, D, ... for more candidates in one run) built side by side from the
# same sources, each candidate checked first (tests/test_stats_cuda on every variant,
# compute-sanitizer on the variants named), then bench/bench_kernel.py alternating the trees, and
# one table of the default path's medians, each candidate beside A.
#
# Here, in the repository (git needed; the GPU machine's copy has no usable history):
#   bench/kernel_ab.sh prepare A B [C ..]  A, B, ...: revisions; a candidate may also be "worktree"
#                                       (the working tree, uncommitted changes too) or
#                                       "REV+PATCHFILE" (REV with a patch)
#   -> .ab/A.tar.gz, .ab/B.tar.gz, ... (ignored by git; carry .ab and .devdeps to the GPU machine)
# There (from the repository root, after `source .devdeps/env.sh &&` where CMake needs it):
#   bench/kernel_ab.sh run [OUTDIR]     OUTDIR default $OUT or ./ab-out; summary.md and
#                                       logs.tar.gz (every log: logs/...) there
# Environment of `run`:
#   AB_ONLY=3,9,2,4,1         bench_kernel.py's shapes (ATTNSTAT_BENCH_ONLY)
#   AB_VARIANTS=10,11         also time these variants in every run (ATTNSTAT_BENCH_VARIANTS)
#   AB_RUNS=2                 rounds of every tree
#   AB_SANITIZE=10,11         compute-sanitizer racecheck and memcheck on the candidates' variants
#                             ("" skips)
#   AB_CHECK=B,C              the trees checked (test and sanitizers; default every candidate;
#                             A only when named)
#   AB_MAXONLY=1              one more round asking for the max logit alone (AB_VARIANTS' too)
#   AB_TEST=1                 test_stats_cuda on the candidates, every variant (0 skips)
#   AB_STEP_LIMIT=300         seconds any test, sanitizer, bench or profile step may take (a hung
#                             kernel is reported as such and the run goes on)
#   AB_DEADLINE=540           seconds from the start by which the run ends: a step gets at most
#                             what is left (less 15 s), one with under 10 s left is skipped and
#                             said, and the logs are packed in time (run it under a shorter
#                             `timeout` than the call's limit and nothing comes back: 2026-11-29)
#   AB_REUSE=1                keep the last run's sources and builds of the same tarballs (same
#                             machine, still warm; a tree prepared anew is built again)
#   AB_LINEINFO=1             build with -lineinfo though nothing is profiled (the same code), so
#                             that a call after an AB_PROFILE call reuses its builds
#   AB_PROFILE=V:SHAPE[:WANT],..  Nsight Compute on variant V at bench/profile_kernel.py's SHAPE
#                             (WANT: PROFILE_WANT, e.g. max_logit) on every tree, all built with
#                             -lineinfo; logs/prof{A,B,..}N.src.csv (the source page with SASS, N
#                             the spec's place in the list) and .details.txt (with the pipes'
#                             utilisation: ComputeWorkloadAnalysis). By region, back in
#                             the repository: bench/kernel_ab.sh regions OUTDIR
#   AB_SASS=REGEX             cuobjdump -sass of the Hopper kernels whose mangled names match
#                             (e.g. 'stats_wsp_kernelILi64ELb0ELi0ELi3ELi64ELi0ELi1E': variant 11,
#                             d64, bf16, FOLD_BASE) from every tree, into logs/sass{A,B,..}.txt
# Every tree is timed even when a check fails, and the summary says which failed: merge only when
# none did.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
LETTERS=(A B C D E F G H) # the trees' names, A first: prepare's arguments in order

# one tree into .ab/T.tar.gz: a revision, "worktree", or "REV+PATCHFILE"
pack() {
    local t=$1 spec=$2
    case "$spec" in
    worktree)
        local idx tree
        idx=$(mktemp) && cp .git/index "$idx" || return 1
        GIT_INDEX_FILE=$idx git add -A -- . ':!.ab' ':!.devdeps' >/dev/null 2>&1
        tree=$(GIT_INDEX_FILE=$idx git write-tree) && rm -f "$idx" &&
            git archive --format=tar.gz -o ".ab/$t.tar.gz" "$tree" || return 1 ;;
    *+*)
        local rev=${spec%%+*} patch=${spec#*+} wt
        wt=$(mktemp -d) && git archive "$rev" | tar x -C "$wt" &&
            (cd "$wt" && patch -p1 -s) < "$patch" &&
            tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - -C "$wt" . |
            gzip -n > ".ab/$t.tar.gz" && rm -rf "$wt" || return 1 ;; # the same tree, the same bytes
    *)
        git archive --format=tar.gz -o ".ab/$t.tar.gz" "$spec" || return 1 ;;
    esac
}

prepare() {
    local t spec i=0
    [ $# -le ${#LETTERS[@]} ] || { echo "kernel_ab: at most ${#LETTERS[@]} trees" >&2; return 2; }
    mkdir -p .ab # ignored (.gitignore): the device tool carries it only when asked to
    for t in "${LETTERS[@]}"; do rm -f ".ab/$t.tar.gz"; done
    rm -f .ab/what.txt
    for spec in "$@"; do
        t=${LETTERS[i]}
        i=$((i + 1))
        pack "$t" "$spec" || { echo "kernel_ab: $t ($spec) failed" >&2; return 1; }
        printf '%s %s\n' "$t" "$(git rev-parse --short "$spec" 2>/dev/null || echo "$spec")" \
            >> .ab/what.txt
        echo "kernel_ab: .ab/$t.tar.gz ($spec)"
    done
    echo "kernel_ab: ready; carry .ab and .devdeps"
}

run() {
    local out=${1:-${OUT:-ab-out}} root=$PWD t0 failed=() trees=() cands=() t
    mkdir -p "$out/logs"
    local L=$out/logs
    for t in "${LETTERS[@]}"; do [ -f ".ab/$t.tar.gz" ] && trees+=("$t"); done
    [ ${#trees[@]} -ge 2 ] && [ "${trees[0]}" = A ] ||
        { echo "kernel_ab: run prepare first" >&2; return 2; }
    for t in "${trees[@]}"; do # A only when named (main as merged, say)
        if [ -z "${AB_CHECK:-}" ]; then [ "$t" = A ] || cands+=("$t")
        elif [[ ",$AB_CHECK," == *",$t,"* ]]; then cands+=("$t"); fi
    done
    t0=$(date +%s)
    # the trees build side by side: the cores shared out (nvcc's big files take GBs each)
    local jobs=$(( ($(nproc) + ${#trees[@]} - 1) / ${#trees[@]} + 1 ))
    export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs}
    local sum li=${AB_LINEINFO:-0}
    [ -n "${AB_PROFILE:-}" ] && li=1 # the profile's source page needs -lineinfo
    for t in "${trees[@]}"; do
        sum="$(md5sum < ".ab/$t.tar.gz") lineinfo=$li"
        # reused only when built from the same tarball, the same way (else a stale build is timed)
        [ "${AB_REUSE:-0}" = 1 ] && [ "$(cat "/tmp/ab-build-$t/.ab-sum" 2>/dev/null)" = "$sum" ] &&
            continue
        rm -rf "/tmp/ab-src-$t" "/tmp/ab-build-$t" && mkdir -p "/tmp/ab-src-$t" &&
            tar xzmf ".ab/$t.tar.gz" -C "/tmp/ab-src-$t"
        (cd "/tmp/ab-src-$t" && BENCH_LINEINFO=$li \
            BUILD=/tmp/ab-build-$t bench/bench_kernel.sh build &&
            echo "$sum" > "/tmp/ab-build-$t/.ab-sum") > "$L/build$t.log" 2>&1 &
    done
    wait
    for t in "${trees[@]}"; do
        [ -f "/tmp/ab-build-$t/kernels/libattnstat_cuda.so" ] ||
            [ -f "/tmp/ab-build-$t/direct/libattnstat_cuda.so" ] ||
            { echo "kernel_ab: build $t failed"; tail -20 "$L/build$t.log"; return 1; }
    done
    echo "kernel_ab: ${trees[*]} built in $(( $(date +%s) - t0 )) s"
    lib() { local b=/tmp/ab-build-$1; [ -f "$b/kernels/libattnstat_cuda.so" ] &&
            echo "$b/kernels/libattnstat_cuda.so" || echo "$b/direct/libattnstat_cuda.so"; }
    tst() { local b=/tmp/ab-build-$1; [ -x "$b/tests/test_stats_cuda" ] &&
            echo "$b/tests/test_stats_cuda" || echo "$b/direct/test_stats_cuda"; }
    if [ -n "${AB_SASS:-}" ]; then
        for t in "${trees[@]}"; do
            find "/tmp/ab-build-$t" -name 'ws_sm90*.o' | sort | while read -r o; do
                cuobjdump -sass "$o" | awk -v re="$AB_SASS" '/Function : /{keep = ($0 ~ re)} keep'
            done > "$L/sass$t.txt"
            echo "kernel_ab: SASS of $t: $(grep -c 'Function : ' "$L/sass$t.txt") functions," \
                "$(grep -cE '^ +/\*[0-9a-f]{4,}\*/' "$L/sass$t.txt") instructions"
        done
    fi
    # a kernel that deadlocks (round 22's first form did) must not take the whole call with it
    local v tool tlim=${AB_STEP_LIMIT:-300} lim skipped=()
    local deadline=$((t0 + ${AB_DEADLINE:-100000}))
    hung() { [ "$1" = 124 ] && echo " (past ${lim} s: a hang, or the deadline)"; }
    # room STEP: the step's limit into lim (AB_STEP_LIMIT, or what AB_DEADLINE leaves, less 15 s
    # to pack the logs); false, and STEP said among the skipped, when under 10 s are left
    room() {
        lim=$((deadline - $(date +%s) - 15))
        [ "$lim" -gt "$tlim" ] && lim=$tlim
        [ "$lim" -ge 10 ] || { skipped+=("$1"); return 1; }
    }
    for t in "${cands[@]}"; do
        if [ "${AB_TEST:-1}" = 1 ]; then
            if room "test_stats_cuda $t"; then
                (cd "/tmp/ab-src-$t" && ATTNSTAT_TEST_VARIANTS=1 timeout "$lim" "$(tst "$t")") \
                    > "$L/test$t.log" 2>&1 || failed+=("test_stats_cuda $t$(hung $?)")
                echo "kernel_ab: test_stats_cuda on $t: $(tail -1 "$L/test$t.log")"
            fi
        fi
        for v in $(echo "${AB_SANITIZE-10,11}" | tr ',' ' '); do
            for tool in racecheck memcheck; do
                room "$tool $v $t" || continue
                (cd "/tmp/ab-src-$t" && ATTNSTAT_TEST_WG_ONLY=$v timeout "$lim" \
                    compute-sanitizer --tool $tool --error-exitcode 9 "$(tst "$t")") \
                    > "$L/$tool$v$t.log" 2>&1 || failed+=("$tool $v $t$(hung $?)")
                echo "kernel_ab: $tool on $t's variant $v:" \
                    "$(grep -E 'SUMMARY' "$L/$tool$v$t.log" | tail -1)"
            done
        done
    done
    local r
    for r in $(seq "${AB_RUNS:-2}"); do
        for t in "${trees[@]}"; do
            room "bench $t round $r" || continue
            (cd "/tmp/ab-src-$t" && ATTNSTAT_BENCH_ONLY=${AB_ONLY:-3,9,2,4,1} \
                ATTNSTAT_BENCH_VARIANTS=${AB_VARIANTS:-} \
                timeout "$lim" python3 bench/bench_kernel.py "$(lib "$t")") \
                > "$L/bench${t}_$r.log" 2>&1 || failed+=("bench $t round $r$(hung $?)")
        done
    done
    if [ "${AB_MAXONLY:-0}" = 1 ]; then
        for t in "${trees[@]}"; do
            room "max-only bench $t" || continue
            (cd "/tmp/ab-src-$t" && ATTNSTAT_BENCH_MAXONLY=1 \
                ATTNSTAT_BENCH_ONLY=${AB_ONLY:-3,9,2,4,1} \
                ATTNSTAT_BENCH_VARIANTS=${AB_VARIANTS:-} \
                ATTNSTAT_BENCH_VARIANTS_WANT=${AB_VARIANTS:+max_logit} \
                timeout "$lim" python3 bench/bench_kernel.py "$(lib "$t")") \
                > "$L/max${t}.log" 2>&1 || failed+=("max-only bench $t$(hung $?)")
        done
    fi
    local spec pv ps pw n=0 tag
    for spec in $(echo "${AB_PROFILE:-}" | tr ',' ' '); do
        IFS=: read -r pv ps pw <<< "$spec"
        n=$((n + 1))
        for t in "${trees[@]}"; do
            tag=$t$n
            room "profile $tag" || continue
            (cd "/tmp/ab-src-$t" && PROFILE_WANT=${pw:-} timeout "$lim" \
                ncu -f -o "/tmp/ab-prof$tag" --section SourceCounters --section WarpStateStats \
                --section SchedulerStats --section InstructionStats --section SpeedOfLight \
                --section ComputeWorkloadAnalysis \
                -k "regex:stats_(wg|ws|mma)" \
                python3 bench/profile_kernel.py "$(lib "$t")" "$pv" "$ps") \
                > "$L/prof$tag.log" 2>&1 &&
                ncu -i "/tmp/ab-prof$tag.ncu-rep" --page details > "$L/prof$tag.details.txt" 2>&1 &&
                ncu -i "/tmp/ab-prof$tag.ncu-rep" --page source --csv --print-source cuda,sass \
                    > "$L/prof$tag.src.csv" 2>"$L/prof$tag.src.err" ||
                failed+=("profile $tag$(hung $?)")
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
        python3 "$root/bench/kernel_ab_table.py" "$L" "${AB_RUNS:-2}" "${trees[@]}"
        echo
        if [ ${#failed[@]} -eq 0 ] && [ ${#skipped[@]} -eq 0 ]; then echo "checks: all passed"
        elif [ ${#failed[@]} -eq 0 ]; then echo "checks: none failed, but not all ran"; else
            printf 'checks FAILED: %s\n' "${failed[*]}"; fi
        [ ${#skipped[@]} -eq 0 ] ||
            printf 'not run, AB_DEADLINE (%s s) near: %s\n' "${AB_DEADLINE:-}" "${skipped[*]}"
    } > "$out/summary.md"
    # every log in one archive: the GPU machine sends back at most 8 files of a call
    tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$L"
    cat "$out/summary.md"
    [ ${#failed[@]} -eq 0 ] && [ ${#skipped[@]} -eq 0 ]
}

# bench/ncu_regions.py on a run's profiles, here (ctags; the GPU machine has none): each tree from
# .ab/{A,B}.tar.gz, so that the source lines are the profiled commit's.
regions() {
    local dir=${1:?usage: bench/kernel_ab.sh regions OUTDIR} t root csv tag
    if [ ! -d "$dir/logs" ] && [ -f "$dir/logs.tar.gz" ]; then
        t=$(mktemp -d) && tar xzf "$dir/logs.tar.gz" -C "$t" && dir=$t || return 1
    fi
    ls "$dir"/logs/prof*.src.csv > /dev/null 2>&1 ||
        { echo "kernel_ab: no profiles in $dir/logs" >&2; return 1; }
    for t in "${LETTERS[@]}"; do
        [ -f ".ab/$t.tar.gz" ] || continue
        root=$(mktemp -d) && tar xzf ".ab/$t.tar.gz" -C "$root" || return 1
        for csv in "$dir/logs/prof$t"[0-9]*.src.csv; do
            [ -f "$csv" ] || continue
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
prepare)
    [ $# -ge 3 ] || { echo "usage: bench/kernel_ab.sh prepare A B [C ..]" >&2; exit 2; }
    shift
    prepare "$@" ;;
run) shift; run "$@" ;;
*) sed -n '2,/^set /{/^#/p}' "$0" >&2; exit 2 ;;
esac
