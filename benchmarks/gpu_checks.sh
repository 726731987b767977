#!/usr/bin/env bash
# What only a GPU can check, in one call that fits a lease (15 minutes of device time, the
# machine's start included), the phases in the order of what they prove:
#
#   nccl-tests    the hook and every algorithm at 2 NCCL ranks (tests/algorithms/test_cuda.py's
#                 two-rank NCCL tests, one at a time): sums and gradients against plain DDP's
#   example-nccl  the example at 2 NCCL ranks, 300 steps: tuner, unhooking, the verdict
#   gain-nccl     what tuning pays on NCCL for one model (benchmarks/step_gain.py, GPT-2 small)
#   plugins       both NCCL plugins loaded and called at 2 ranks (benchmarks/nccl_plugins.py):
#                 every usable cell steered, each read back from the profiler's records
#   env           the machine, torch, NCCL, and the GPU series as a scrape of real NVML shows them
# and, by name only (not in the default run): tests (the rest of test_cuda.py), example (world
# size 1 on NCCL, 2 on gloo with CUDA tensors), gain-resnet (ResNet-50 on NCCL), gain-gloo,
# faults-nccl (the fault contract on NCCL: benchmarks/faults.py --nccl).
#
# Here, once (pip needs an index; the GPU machine has none):
#   mkdir -p .gpu && cp ../shared/gpu/libnccl.so.2.30.7-sm90.* .gpu/
#   bash benchmarks/gpu_checks.sh wheels                     # optuna and its needs into .whl/
#   BUDGET_S=540 bash benchmarks/gpu_checks.sh --plan         # the phases, caps and total
#   PY=.venv/bin/python bash benchmarks/gpu_checks.sh --cpu   # walks every setup, no GPU
# On the GPU machine (the device tool's run, carry [".gpu", ".whl"], timeout_s 600):
#   BUDGET_S=540 bash benchmarks/gpu_checks.sh [PHASE ...]
#
# Everything comes back as two files in $OUT: gpu-checks.tgz (every log and JSON) and
# summary.txt (each phase: its cap, how long it took, how it ended, its key lines). Both are
# rewritten after each phase, so a call cut short still returns what ran.
#
# BUDGET_S (default 540) is the device time this call may take; 60 s of it are left for the
# machine's start and the copy back. --plan exits 1 where the phases' caps add up to more. Each
# phase is ended at its cap with SIGABRT, so each Python process of it (faulthandler is on)
# prints where its threads were; a test fails after 75 s (pytest-timeout) with its report.
#
# The script stops in its first seconds where something it needs is missing: torch with CUDA
# (not with --cpu), a C compiler and Python's headers (the NCCL plugins are a C extension),
# NCCL 2.30.7 in .gpu/ (two NCCL ranks on one GPU need NCCL >= 2.30; the image has 2.28.9),
# optuna or .whl/. PY names the Python (default: python3); WORK the scratch folder.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
OUT="${OUT:-gpu-checks}"
WORK="${WORK:-/tmp/autotune-gpu-checks}"
BUDGET_S="${BUDGET_S:-540}"
RESERVE_S=60  # the machine's start and the copy back
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
WHEELS=(optuna==5.0.0 alembic==1.20.1 colorlog==6.12.0 sqlalchemy==2.1.9 mako==1.4.3)
SITE=/tmp/autotune-gpu-site
NCCL_XZ="${NCCL_XZ:-.gpu/libnccl.so.2.30.7-sm90.xz}"
NCCL_LIB=/tmp/autotune-nccl-2.30.7/libnccl.so.2
T=tests/algorithms/test_cuda.py

# Each phase's cap, in seconds: what it took on an H200 (docs/BENCHMARKS.md, "On a GPU"),
# with room. setup: the wheels, the plugins' build, NCCL unpacked and checked.
declare -A CAP=(
    [setup]=40 [nccl-tests]=90 [example-nccl]=60 [gain-nccl]=170 [plugins]=80 [env]=30
    [tests]=150 [example]=150 [gain-resnet]=170 [gain-gloo]=280 [faults-nccl]=150
)
DEFAULT=(nccl-tests example-nccl gain-nccl plugins env)
ALL=(nccl-tests example-nccl gain-nccl plugins env tests example gain-resnet gain-gloo faults-nccl)

wheels() {
    rm -rf .whl && mkdir -p .whl
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
}

plan() {  # plan PHASE...: each phase's cap and the total, against the budget
    local total=${CAP[setup]} p
    printf '%-14s %5s s\n' setup "${CAP[setup]}"
    for p in "$@"; do
        printf '%-14s %5s s\n' "$p" "${CAP[$p]}"
        total=$((total + CAP[$p]))
    done
    printf '%-14s %5s s  (budget %s s, less %s s for the start and the copy back: %s s)\n' \
        total "$total" "$BUDGET_S" "$RESERVE_S" "$((BUDGET_S - RESERVE_S))"
    if [ "$total" -gt $((BUDGET_S - RESERVE_S)) ]; then
        echo "over the budget by $((total - BUDGET_S + RESERVE_S)) s: name fewer phases, or raise BUDGET_S"
        return 1
    fi
}

missing=()
preflight() {  # what the phases need, said in the first seconds
    command -v "$PY" >/dev/null || { echo "no $PY (set PY)"; return 1; }
    local torch_ok
    torch_ok=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null)
    if [ -z "$torch_ok" ]; then
        missing+=("torch for $PY")
    elif [ "$torch_ok" != 1 ] && [ "$DRY" = 0 ]; then
        missing+=("a CUDA device torch can see (run --cpu for a dry run)")
    fi
    command -v "${CC:-cc}" >/dev/null || missing+=("a C compiler (${CC:-cc}): the NCCL plugins are C")
    local inc
    inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
    [ -n "$inc" ] && [ -f "$inc/Python.h" ] || missing+=("Python's headers (Python.h in ${inc:-?})")
    [ -f "$NCCL_XZ" ] || missing+=("$NCCL_XZ (cp ../shared/gpu/libnccl.so.2.30.7-sm90.* .gpu/)")
    if [ ! -d .whl ] && ! "$PY" -c 'import optuna' 2>/dev/null; then
        missing+=(".whl/ or optuna (bash benchmarks/gpu_checks.sh wheels, where pip has an index)")
    fi
    if [ "${#missing[@]}" -gt 0 ]; then
        printf 'missing: %s\n' "${missing[@]}"
        return 1
    fi
}

NCCL230=""  # the 2.30.7 library, once a process preloading it was seen to run it
setup() {
    mkdir -p "$SITE"
    if [ -d .whl ] && ! "$PY" -c 'import optuna' 2>/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
            .whl/*.whl || return 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" \
        plugins/autotune-baselines plugins/autotune-nccl || return 1
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    mkdir -p "$(dirname "$NCCL_LIB")"
    "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
        "$NCCL_XZ" "$NCCL_LIB" || return 1
    local want got seen
    want=$(awk '{print $1}' "${NCCL_XZ%.xz}.sha256" 2>/dev/null)
    got=$(sha256sum "$NCCL_LIB" | awk '{print $1}')
    if [ -n "$want" ] && [ "$want" != "$got" ]; then
        echo "sha256 of $NCCL_LIB is $got, expected $want"
        return 1
    fi
    # The library's answer, not torch.cuda.nccl.version() (torch's header: 2.28.9 whatever runs).
    seen=$(LD_PRELOAD="$NCCL_LIB" "$PY" -m autotune.comm.nccl_version 2>&1)
    echo "with LD_PRELOAD=$NCCL_LIB, NCCL runs: $seen"
    [ "$seen" = 2.30.7 ] || { echo "not 2.30.7: two NCCL ranks on one GPU cannot run"; return 1; }
    NCCL230="$NCCL_LIB"
}

two_nccl_ranks() {  # COMMAND...: on 2 NCCL ranks, the 2.30.7 build preloaded
    LD_PRELOAD="$NCCL230" NCCL_MULTI_RANK_GPU_ENABLE=1 "$@"
}

DRY=0
PHASE_END=0
capped() {  # capped SECONDS COMMAND...: COMMAND, ended at SECONDS or at the phase's cap
    local left=$((PHASE_END - SECONDS))
    local cap=$(($1 < left ? $1 : left))
    shift
    if [ "$DRY" = 1 ]; then  # say it, and check that it would start: its tests, its options
        echo "would run (at most $cap s)${LD_PRELOAD:+ with LD_PRELOAD=$LD_PRELOAD}: $*"
        if [ "${2:-}" = -m ] && [ "${3:-}" = pytest ]; then
            "$@" --collect-only -q | tail -1
        else
            "$1" "$2" --help >/dev/null && echo "  $2 --help: ok"
        fi
        return
    fi
    if [ "$cap" -le 5 ]; then
        echo "not run (the phase's cap is spent): $*"
        return 1
    fi
    timeout -s ABRT -k 10 "$cap" "$@"
    local rc=$?
    [ "$rc" -eq 124 ] && echo "cut short after $cap s (SIGABRT: the stacks are above): $*"
    return "$rc"
}

nccl_tests_phase() {  # one at a time: two ranks share the GPU
    two_nccl_ranks capped 90 "$PY" -m pytest -p no:cacheprovider -n 0 --timeout 75 -rfEs \
        --durations=5 "$T::test_nccl_two_ranks" "$T::test_hook_on_nccl_two_ranks" \
        2>&1 | tee "$WORK/nccl-tests.log"
}

example_nccl_phase() {
    two_nccl_ranks capped 60 "$PY" examples/train_ddp.py --world-size 2 --device cuda \
        --backend nccl --steps 300 2>&1 | tee "$WORK/example-nccl.log"
}

gain() {  # gain BACKEND MODELS NAME [PRELOAD]: benchmarks/step_gain.py on the GPU models
    local run=(capped 280 "$PY" benchmarks/step_gain.py --device cuda --backend "$1" --models "$2"
        --world-sizes 2 --tune-steps 300 --paired-steps 100 --paired-seconds 3
        --run-timeout 120 --json "$WORK/$3.json")
    if [ "$1" = nccl ]; then
        two_nccl_ranks "${run[@]}" 2>&1 | tee "$WORK/$3.log"
    else
        "${run[@]}" 2>&1 | tee "$WORK/$3.log"
    fi
}

plugins_phase() {  # at 2 ranks (NCCL's one-rank path calls neither plugin); where that fails,
    # the tuner alone, to tell which of the two it was
    local rc=0
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,PROFILE two_nccl_ranks capped 50 "$PY" \
        benchmarks/nccl_plugins.py --world-size 2 --json "$WORK/plugins-2.json" \
        >"$WORK/plugins.log" 2>&1 || rc=$?
    grep -v "NCCL INFO" "$WORK/plugins.log"
    grep -E "PROFILER/Plugin|TUNER/Plugin|autotune (profiler|tuner)" "$WORK/plugins.log" | head -8
    if [ "$rc" -ne 0 ]; then
        echo "both plugins: rc $rc; the tuner alone:"
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING two_nccl_ranks capped 30 "$PY" \
            benchmarks/nccl_plugins.py --world-size 2 --no-profiler \
            --json "$WORK/plugins-2-tuner-only.json" >"$WORK/plugins-tuner-only.log" 2>&1
        grep -v "NCCL INFO" "$WORK/plugins-tuner-only.log"
    fi
    return "$rc"
}

env_phase() {
    {
        [ "$DRY" = 1 ] || nvidia-smi
        nproc
        capped 30 "$PY" benchmarks/gpu_env.py
    } 2>&1 | tee "$WORK/env.txt"
}

tests_phase() {  # the rest of test_cuda.py, one at a time
    capped 150 "$PY" -m pytest -p no:cacheprovider -n 0 --timeout 75 -rfEs --durations=10 "$T" \
        --deselect "$T::test_nccl_two_ranks" --deselect "$T::test_hook_on_nccl_two_ranks" \
        2>&1 | tee "$WORK/tests.log"
}

example_phase() {
    {
        capped 45 "$PY" examples/train_ddp.py --world-size 1 --device cuda --backend nccl \
            --steps 300
        capped 100 "$PY" examples/train_ddp.py --world-size 2 --device cuda --backend gloo \
            --steps 300
    } 2>&1 | tee "$WORK/example.log"
}

faults_phase() {  # NCCL's watchdog against autotune's fault contract, 2 ranks
    two_nccl_ranks capped 150 "$PY" benchmarks/faults.py --nccl 2>&1 | tee "$WORK/faults-nccl.md"
}

run_phase() {
    case "$1" in
        nccl-tests) nccl_tests_phase ;;
        example-nccl) example_nccl_phase ;;
        gain-nccl) gain nccl gpt2 gain-nccl ;;
        plugins) plugins_phase ;;
        env) env_phase ;;
        tests) tests_phase ;;
        example) example_phase ;;
        gain-resnet) gain nccl resnet50 gain-resnet ;;
        gain-gloo) gain gloo resnet50,gpt2 gain-gloo ;;
        faults-nccl) faults_phase ;;
    esac
}

# The key lines of a phase's output, for the summary.
KEYS='passed|failed|error|skipped|verdict|autotune vs plain|step clock|gpt2 x|resnet50 x|NOT |cut short|not run|Segmentation|Fatal|Loaded autotune|Using autotune|NCCL runs|nccl: |nvml_up|would run'

pack() {  # the two files that come back: the archive and the summary
    mkdir -p "$OUT"
    tar czf "$OUT/gpu-checks.tgz.part" -C "$(dirname "$WORK")" "$(basename "$WORK")" &&
        mv "$OUT/gpu-checks.tgz.part" "$OUT/gpu-checks.tgz"
    cp "$WORK/summary.txt" "$OUT/summary.txt"
}

main() {
    DRY=0
    local phases=() p
    for p in "$@"; do
        case "$p" in
            --cpu) DRY=1 ;;
            --plan) ;;
            *)
                [ -n "${CAP[$p]:-}" ] && [ "$p" != setup ] || {
                    echo "unknown phase $p (${ALL[*]})" >&2
                    return 2
                }
                phases+=("$p")
                ;;
        esac
    done
    [ "${#phases[@]}" -gt 0 ] || phases=("${DEFAULT[@]}")
    [ "$DRY" = 1 ] && [ "$#" -eq 1 ] && phases=("${ALL[@]}")  # --cpu alone walks every phase
    if [[ " $* " == *" --plan "* ]]; then
        plan "${phases[@]}"
        return
    fi
    rm -rf "$WORK" && mkdir -p "$WORK"
    local summary="$WORK/summary.txt"
    {
        echo "gpu_checks.sh $* at $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (with changes)'), $(date -u +%FT%TZ)"
        plan "${phases[@]}" || echo "(over the budget: the last phases may be cut)"
    } >"$summary"
    local start=$SECONDS
    PHASE_END=$((SECONDS + CAP[setup]))
    if ! preflight >"$WORK/setup.log" 2>&1 || ! setup >>"$WORK/setup.log" 2>&1; then
        cat "$WORK/setup.log"
        { echo "setup: FAILED after $((SECONDS - start)) s"; tail -20 "$WORK/setup.log"; } >>"$summary"
        pack
        return 1
    fi
    echo "setup: ok in $((SECONDS - start)) s; $(grep 'NCCL runs' "$WORK/setup.log")" | tee -a "$summary"
    local status=0 rc began end_all=$((start + BUDGET_S - RESERVE_S))
    for p in "${phases[@]}"; do
        began=$SECONDS
        PHASE_END=$((SECONDS + CAP[$p]))
        [ "$PHASE_END" -gt "$end_all" ] && PHASE_END=$end_all
        echo "== $p (cap ${CAP[$p]} s)"
        run_phase "$p" >"$WORK/$p.out" 2>&1
        rc=$?
        cat "$WORK/$p.out"
        [ "$rc" -eq 0 ] || status=1
        {
            echo "== $p: $([ "$rc" -eq 0 ] && echo ok || echo "FAILED (rc $rc)") in $((SECONDS - began)) s of ${CAP[$p]}"
            grep -E "$KEYS" "$WORK/$p.out" | grep -v "NCCL INFO" | cut -c1-300 | head -25
        } >>"$summary"
        pack
    done
    echo "== returned: $OUT/gpu-checks.tgz ($(tar tzf "$OUT/gpu-checks.tgz" | grep -vc '/$') files), $OUT/summary.txt" |
        tee -a "$summary"
    [ "$DRY" = 1 ] && tar tzf "$OUT/gpu-checks.tgz"
    pack
    return $status
}

if [ "${1:-}" = wheels ]; then
    wheels
    exit
fi
main "$@"
