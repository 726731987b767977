#!/usr/bin/env bash
# Everything the suite skips without a GPU, and issue 10's GPU cell, in one go on a GPU machine:
# the CUDA conformance and hook tests, the example on CUDA, and what tuning pays on CUDA tensors.
#
#   bash benchmarks/gpu_checks.sh wheels                # where pip reaches an index: .whl/
#   OUT=DIR bash benchmarks/gpu_checks.sh [PHASE ...]    # on the GPU machine (default: all)
#
# Phases: env (the machine, torch, CUDA, NCCL), tests (tests/test_cuda.py, then the example at
# world size 1 on NCCL and at 2 on gloo with CUDA tensors), gain-gloo (benchmarks/step_gain.py on
# CUDA tensors over gloo, 2 ranks), gain-nccl (the same on NCCL; 2 ranks on one GPU need NCCL 2.30
# or newer, which it checks first). Each writes its log, and the benchmarks their JSON, under $OUT
# (default: gpu-checks/), at most seven files. PY names the Python (default: python3).
#
# For a machine with no package index: `wheels` downloads optuna and what it needs that a CUDA
# image with torch lacks into .whl/ (ignored by git); the phases install .whl/ into a scratch
# directory first, when it is there. The NCCL tuner plugin (plugins/autotune-nccl, which
# tests/test_cuda.py loads) is built there too; it needs a C compiler.
#
# Never run on a GPU yet: no session had one. What it measured goes into docs/BENCHMARKS.md.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
OUT="${OUT:-gpu-checks}"
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
        plugins/autotune-nccl || echo "plugins/autotune-nccl did not build: tests/test_cuda.py cannot load it"
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
}

env_phase() {
    {
        nvidia-smi || true
        "$PY" - <<'EOF'
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("devices", torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
print("nccl", torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None)
EOF
    } 2>&1 | tee "$OUT/env.txt"
}

tests_phase() {
    "$PY" -m pytest -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log"
    {
        "$PY" examples/train_ddp.py --world-size 1 --device cuda --steps 300
        "$PY" examples/train_ddp.py --world-size 2 --device cuda --backend gloo --steps 300
    } 2>&1 | tee "$OUT/example.log"
}

gain() {  # gain BACKEND
    PYTHONUNBUFFERED=1 "$PY" benchmarks/step_gain.py --device cuda --backend "$1" \
        --world-sizes 2 --paired-steps 80 --paired-seconds 10 \
        --json "$OUT/step-gain-cuda-$1.json" 2>&1 | tee "$OUT/step-gain-cuda-$1.log"
}

nccl_phase() {
    if "$PY" -c 'import sys, torch; sys.exit(torch.cuda.device_count() < 2 and torch.cuda.nccl.version()[:2] < (2, 30))'; then
        NCCL_MULTI_RANK_GPU_ENABLE=1 gain nccl
    else
        echo "gain-nccl skipped: 2 ranks on one GPU need NCCL >= 2.30" | tee "$OUT/step-gain-cuda-nccl.log"
    fi
}

if [ "${1:-}" = wheels ]; then
    wheels
    exit
fi
mkdir -p "$OUT"
setup || exit 1
status=0
for phase in "${@:-env tests gain-gloo gain-nccl}"; do
    for p in $phase; do
        case "$p" in
            env) env_phase ;;
            tests) tests_phase ;;
            gain-gloo) gain gloo ;;
            gain-nccl) nccl_phase ;;
            *) echo "unknown phase $p (env, tests, gain-gloo, gain-nccl)" >&2; exit 2 ;;
        esac || status=1
    done
done
exit $status
