# The two commands: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# CPU build of torch; the pin lives here only, pyproject declares a range for users.
TORCH_SPEC ?= torch==2.13.0
# What the demo needs (torch and autotune), then what the suite needs on top (the test extras,
# the plugins): `make demo` on a fresh machine installs the first only.
BASE := $(VENV)/.installed-base
STAMP := $(VENV)/.installed

.PHONY: venv test test-fast lint pytest demo bench bench-all clean

venv: $(STAMP)

PLUGINS := plugins/autotune-baselines plugins/autotune-lightning plugins/autotune-hf

# The NCCL tuner and profiler plugins are a C library: installed (built), not editable; rebuilt
# when it changes.
NCCL_PLUGIN := plugins/autotune-nccl

$(BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e .
	touch $@

$(STAMP): $(BASE) $(addsuffix /pyproject.toml,$(PLUGINS)) $(wildcard $(NCCL_PLUGIN)/*.py $(NCCL_PLUGIN)/*.toml $(NCCL_PLUGIN)/autotune_nccl/* $(NCCL_PLUGIN)/autotune_nccl/played/*)
	$(PY) -m pip install --quiet -e ".[test]" $(addprefix -e ,$(PLUGINS))
	$(PY) -m pip install --quiet ./$(NCCL_PLUGIN)
	touch $@

test: lint pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	@# The layer contract: no import circle, no layer importing one above it (tools/layers.py).
	$(PY) tools/layers.py
	@# Every path of the tree a doc names exists (tools/doc_paths.py).
	$(PY) tools/doc_paths.py

# Two pytest-xdist workers, a test file each at a time (its module fixtures, such as one
# Prometheus for a file's tests, stay in one worker). `make pytest PYTEST_ARGS=` runs serially.
PYTEST_ARGS ?= -n 2 --dist loadfile

pytest: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# The tests that spawn no ranks and start no server or namespace: about 30 s here, for the loop
# of an edit (make test is what CI and a finished change run).
test-fast: $(STAMP)
	$(PY) -m pytest -n 2 -m "not distributed and not needs_server and not needs_root and not cuda"

demo: $(BASE)
	$(PY) examples/train_ddp.py --world-size 4 --steps 600 --metrics-port 0

# The step-gain guard (benchmarks/guard.py, about 15 minutes): run it before finishing a change
# to the engine, the tuner, the algorithms or the hook; RECORD=1 makes its figures the record
# (benchmarks/baseline.json). `make bench-all` runs every benchmark behind docs/BENCHMARKS.md.
RECORD ?=
bench: $(STAMP)
	$(PY) benchmarks/guard.py $(if $(RECORD),--record)

bench-all: $(STAMP)
	$(PY) benchmarks/allreduce_busbw.py --world-sizes 2,4 --sizes 64K,1M,16M --iters 50 --markdown
	$(PY) benchmarks/hook_overhead.py --world-size 4 --steps 200
	$(PY) benchmarks/unhook_cost.py --world-size 4 --steps 300
	$(PY) benchmarks/tuner_cost.py --world-size 4 --steps 300
	$(PY) benchmarks/step_gain.py --world-sizes 2,4 --paired-steps 80 --paired-seconds 20
	$(PY) benchmarks/paired_test_power.py
	$(PY) benchmarks/metrics_cost.py --world-size 4 --steps 100
	$(PY) benchmarks/model_fit.py docs/sweeps/sweep-2.json docs/sweeps/sweep-4.json docs/sweeps/sweep-8.json
	@# Emulated nodes need root (network namespaces): docs/CLUSTER.md.
	if [ "$$(id -u)" = 0 ]; then $(PY) benchmarks/cluster_sweep.py --layouts 2x2,4x1 --markdown; \
	else echo "benchmarks/cluster_sweep.py skipped: it needs root"; fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
