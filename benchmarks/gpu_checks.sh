#!/usr/bin/env bash
# Everything the suite skips without a GPU, and issue 10's GPU cell, in one go on a GPU machine:
# the CUDA conformance and hook tests, the example on CUDA, and what tuning pays on CUDA tensors.
#
#   bash benchmarks/gpu_checks.sh wheels                # where pip reaches an index: .whl/
#   OUT=DIR bash benchmarks/gpu_checks.sh [PHASE ...]    # on the GPU machine (default: all)
#
# Phases: env (the machine, torch, CUDA, NCCL, and the GPU series as a scrape of real NVML
# shows them), plugins (autotune-nccl's tuner and profiler under the image's NCCL at world size 1,
# then at 2 ranks on the NCCL 2.30.7 build: benchmarks/nccl_plugins.py), tests (tests/algorithms/test_cuda.py), example (the example at world size 1 on NCCL and at 2
# on gloo with CUDA tensors), gain-gloo (benchmarks/step_gain.py on CUDA tensors over gloo, 2
# ranks; GPT-2 small in bf16 and ResNet-50, benchmarks/gpu_models.py), gain-nccl (the same on
# NCCL; 2 ranks on one GPU need NCCL 2.30 or newer, which it checks first), faults-nccl (the fault contract on NCCL at 2 ranks, benchmarks/faults.py
# --nccl: the same NCCL check; not in the default run). Each writes its log, and the
# benchmarks their JSON, under
# $OUT (default: gpu-checks/), at most seven files. PY names the Python (default: python3).
#
# A lease is short: BUDGET_S (seconds, default none) ends the whole run in time, and each phase
# gets at most its share (env 30, tests 240, example 90, gain-* 280) of what is left; a phase cut
# short says so in its log, and step_gain's JSON holds every model it finished (a run of it that
# takes over 90 s is killed, and the next model runs). What is cut is
# ended with SIGABRT, so every Python process of it (faulthandler is on) prints where each of its
# threads was; a test is failed after 75 s (pytest-timeout), so its report is printed in time
# (ten tests, three at a time: within the phase's 240 s unless more than nine hung).
#
# Two NCCL ranks on the one GPU need NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1; the image has
# 2.28.9. Copy the build from ../shared/gpu into the checkout's ignored .gpu/ first and carry it:
#   mkdir -p .gpu && cp ../shared/gpu/libnccl.so.2.30.7-sm90.* .gpu/
# setup unpacks it, checks its sha256 and that torch then reports 2.30.7 (nccl-2.30.txt says what
# failed if not), and the phases that run 2 NCCL ranks preload it.
#
# For a machine with no package index: `wheels` downloads optuna and what it needs that a CUDA
# image with torch lacks into .whl/ (ignored by git); the phases install .whl/ into a scratch
# directory first, when it is there. The NCCL tuner plugin (plugins/autotune-nccl, which
# tests/algorithms/test_cuda.py loads) is built there too; it needs a C compiler.
#
# Run once, on an H200 (2026-11-26, docs/BENCHMARKS.md "On a GPU"): the hook hung at the first
# step there (fixed since); run it again, and record what it measures there.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
OUT="${OUT:-gpu-checks}"
END=$((SECONDS + ${BUDGET_S:-1000000}))
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
WHEELS=(optuna==5.0.0 alembic==1.20.1 colorlog==6.12.0 sqlalchemy==2.1.9 mako==1.4.3)

wheels() {
    rm -rf .whl && mkdir -p .whl
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
}

setup() {
    local site=/tmp/autotune-gpu-site
    mkdir -p "$site"
    if [ -d .whl ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
            .whl/*.whl || return 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" \
        plugins/autotune-baselines || echo "plugins/autotune-baselines did not install: the sweep tests need it"
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" \
        plugins/autotune-nccl || echo "plugins/autotune-nccl did not build: tests/algorithms/test_cuda.py cannot load it"
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    nccl230_setup
}

NCCL230=""  # the path of NCCL 2.30.7 once torch has been seen to load it
nccl230_setup() {
    local xz=.gpu/libnccl.so.2.30.7-sm90.xz lib=/tmp/autotune-nccl-2.30.7/libnccl.so.2
    {
        if [ ! -f "$xz" ]; then
            echo "no $xz: 2 NCCL ranks on one GPU only where the image's NCCL is 2.30 or newer"
            return 0
        fi
        mkdir -p "$(dirname "$lib")"
        "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$xz" "$lib" || { echo "unpacking $xz failed"; return 0; }
        if [ -f .gpu/libnccl.so.2.30.7-sm90.sha256 ]; then
            local want got
            want=$(awk '{print $1}' .gpu/libnccl.so.2.30.7-sm90.sha256)
            got=$(sha256sum "$lib" | awk '{print $1}')
            [ "$want" = "$got" ] || { echo "sha256 of $lib is $got, expected $want: not used"; return 0; }
        fi
        local seen
        seen=$(LD_PRELOAD="$lib" NCCL_MULTI_RANK_GPU_ENABLE=1 "$PY" -m autotune.comm.nccl_version 2>&1)
        echo "torch with LD_PRELOAD=$lib reports NCCL: $seen"
        if [ "$seen" = "2.30.7" ]; then
            NCCL230="$lib"
        else
            echo "not 2.30.7: torch keeps its own NCCL (statically linked or loaded by path); 2 NCCL ranks on one GPU are skipped"
        fi
    } 2>&1 | tee "$OUT/nccl-2.30.txt"
    grep -q "reports NCCL: 2.30.7$" "$OUT/nccl-2.30.txt" && NCCL230="$lib"
    return 0
}

two_nccl_ranks() {  # two_nccl_ranks COMMAND...: on 2 ranks of NCCL, preloading 2.30.7 if needed
    if [ -n "$NCCL230" ]; then
        LD_PRELOAD="$NCCL230" NCCL_MULTI_RANK_GPU_ENABLE=1 "$@"
    elif "$PY" -c 'import sys, torch; sys.exit(from autotune.comm.nccl_version import runtime_version as v; sys.exit(torch.cuda.device_count() < 2 and (v() or (0,))[:2] < (2, 30))'; then
        NCCL_MULTI_RANK_GPU_ENABLE=1 "$@"
    else
        echo "skipped: 2 ranks on one GPU need NCCL >= 2.30 (see nccl-2.30.txt): $*"
        return 1
    fi
}

plugins_phase() {  # NCCL loading both plugins at 2 ranks (NCCL's one-rank path calls neither);
    # each steered cell read back from the profiler; where that fails, the tuner alone, to tell
    # which of the two it was.
    export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,PROFILE
    {
        two_nccl_ranks capped 120 "$PY" benchmarks/nccl_plugins.py --world-size 2 \
            --json "$OUT/plugins-2.json" ||
            two_nccl_ranks capped 90 "$PY" benchmarks/nccl_plugins.py --world-size 2 \
                --no-profiler --json "$OUT/plugins-2-tuner-only.json"
    } 2>&1 | tee "$OUT/plugins.log" | grep -v "NCCL INFO" | tail -80
    unset NCCL_DEBUG NCCL_DEBUG_SUBSYS
    grep -E "PROFILER|TUNER|Profiler|Tuner|autotune|steered" "$OUT/plugins.log" | head -60
}

capped() {  # capped SECONDS COMMAND...: COMMAND, ended at SECONDS or where the budget ends
    local left=$((END - SECONDS))
    local cap=$(($1 < left ? $1 : left))
    shift
    if [ "$cap" -le 5 ]; then
        echo "not run (the budget is spent): $*"
        return 1
    fi
    timeout -s ABRT -k 10 "$cap" "$@"
    local rc=$?
    [ "$rc" -eq 124 ] && echo "cut short after $cap s (SIGABRT: the stacks are above): $*"
    return "$rc"
}

env_phase() {
    {
        nvidia-smi || true
        nproc
        capped 30 "$PY" - <<'EOF'
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("devices", torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
from autotune.comm.nccl_version import runtime_version
print("nccl: torch built with", torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None, "runs", runtime_version())
import autotune, optuna
print("autotune", autotune.__version__, "optuna", optuna.__version__)
# The GPU series as a scrape shows them: only a fake NVML has fed them anywhere else.
from prometheus_client import CollectorRegistry, generate_latest
from autotune.metrics import NvmlMetrics, PynvmlQuery
print(PynvmlQuery().readings())
registry = CollectorRegistry()
registry.register(NvmlMetrics())
print(generate_latest(registry).decode())
# step_gain's ResNet-50 (benchmarks/gpu_models.py) against torchvision's, tensor for tensor.
import sys
sys.path.insert(0, "benchmarks")
from gpu_models import resnet50
try:
    import torchvision
    theirs = [tuple(p.shape) for p in torchvision.models.resnet50().parameters()]
    ours = [tuple(p.shape) for p in resnet50().parameters()]
    print("resnet50: the same tensors as torchvision", torchvision.__version__, ours == theirs)
except ImportError as exc:
    print("resnet50: torchvision not there to compare:", exc)
EOF
    } 2>&1 | tee "$OUT/env.txt"
}

tests_phase() {  # three at a time: the GPU is shared, the ranks are many
    # On the 2.30.7 build where torch took it: the two-rank NCCL tests skip on the image's 2.28.9.
    local preload=()
    [ -n "$NCCL230" ] && preload=(env LD_PRELOAD="$NCCL230" NCCL_MULTI_RANK_GPU_ENABLE=1)
    capped 240 "${preload[@]}" "$PY" -m pytest -p no:cacheprovider -n "${XDIST:-3}" --timeout 75 -rfEs \
        --durations=10 ${CUDA_TESTS:-tests/algorithms/test_cuda.py} \
        2>&1 | tee "$OUT/test_cuda.log"
}

example_phase() {
    {
        capped 45 "$PY" examples/train_ddp.py --world-size 1 --device cuda --steps 300
        capped 90 "$PY" examples/train_ddp.py --world-size 2 --device cuda --backend gloo \
            --steps 300
        two_nccl_ranks capped 90 "$PY" examples/train_ddp.py --world-size 2 --device cuda \
            --backend nccl --steps 300
    } 2>&1 | tee "$OUT/example.log"
}

gain() {  # gain BACKEND MODELS: the models sized for a GPU (benchmarks/gpu_models.py)
    capped 280 "$PY" benchmarks/step_gain.py --device cuda --backend "$1" --models "$2" \
        --world-sizes 2 --tune-steps 300 --paired-steps 100 --paired-seconds 3 \
        --run-timeout "${GAIN_RUN_TIMEOUT:-90}" --json "$OUT/step-gain-cuda-$1.json" 2>&1 | tee "$OUT/step-gain-cuda-$1.log"
}

faults_phase() {  # the fault contract on NCCL, 2 ranks: NCCL's watchdog against autotune's
    two_nccl_ranks capped 240 "$PY" benchmarks/faults.py --nccl 2>&1 | tee "$OUT/faults-nccl.md"
}

nccl_phase() {
    two_nccl_ranks gain nccl "${NCCL_MODELS:-gpt2,resnet50}" 2>&1 | tail -3
}

example_nccl_phase() {
    two_nccl_ranks capped 90 "$PY" examples/train_ddp.py --world-size 2 --device cuda \
        --backend nccl --steps 300 2>&1 | tee "$OUT/example-nccl.log"
}

if [ "${1:-}" = wheels ]; then
    wheels
    exit
fi
mkdir -p "$OUT"
setup || exit 1
status=0
for phase in "${@:-env plugins tests example gain-gloo gain-nccl}"; do
    for p in $phase; do
        case "$p" in
            env) env_phase ;;
            plugins) plugins_phase ;;
            tests) tests_phase ;;
            example) example_phase ;;
            example-nccl) example_nccl_phase ;;
            gain-gloo) gain gloo resnet50,gpt2 ;;  # 100 MB of fp32 gradients a step first
            gain-nccl) nccl_phase ;;
            faults-nccl) faults_phase ;;
            *) echo "unknown phase $p (env, plugins, tests, example, gain-gloo, gain-nccl, faults-nccl)" >&2; exit 2 ;;
        esac || status=1
    done
done
exit $status
