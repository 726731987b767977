"""The conformance suite on CUDA tensors: gloo staging through pinned memory, and NCCL.

Gated on a CUDA device: CI has none, and a session that is lent a GPU runs these.
"""

from __future__ import annotations

import pytest
import torch

from autotune.algorithms import get_algorithm_class
from autotune.comm.launch import run_local
from autotune.comm.nccl_version import runtime_version
from autotune.testing.conformance import (
    Case,
    algorithms_under_test,
    failures,
    run_conformance,
    runnable_on,
)
from autotune_nccl import library_path

pytestmark = [pytest.mark.cuda, pytest.mark.distributed]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _cases(world_size: int) -> list[Case]:
    out = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for numel in (0, 1, world_size + 1, 4099, 300_001):
            out.append(Case(numel, dtype))
            if numel > 1000:
                out.append(Case(numel, dtype, segment_bytes=64 << 10))
    return out


@needs_cuda
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_gloo_with_cuda_tensors(world_size: int) -> None:
    names = algorithms_under_test()  # gloo: NCCL's combinations steer nothing, one stands for all
    got = run_conformance(world_size, names, case_list=_cases(world_size), device="cuda")
    problems = failures(got)
    assert not problems, "\n".join(problems[:20])


@needs_cuda
def test_nccl_world_of_one() -> None:
    got = run_conformance(
        1, runnable_on("nccl/cuda"), case_list=_cases(1), device="cuda", backend="nccl"
    )
    problems = failures(got)
    assert not problems, "\n".join(problems[:20])


def _nccl_allows_ranks_sharing_a_gpu() -> bool:
    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        return False
    if torch.cuda.device_count() >= 2:
        return True
    version = runtime_version()  # not torch.cuda.nccl.version(): that is the header's
    return version is not None and version[:2] >= (2, 30)


needs_two_nccl_ranks = pytest.mark.skipif(
    not _nccl_allows_ranks_sharing_a_gpu(),
    reason="needs two GPUs, or one GPU and NCCL >= 2.30 (NCCL_MULTI_RANK_GPU_ENABLE)",
)


@needs_two_nccl_ranks
def test_nccl_two_ranks() -> None:
    got = run_conformance(
        2,
        runnable_on("nccl/cuda"),
        case_list=_cases(2),
        device="cuda",
        backend="nccl",
        # With autotune's tuner plugin loaded, each nccl.* algorithm forces its cell of NCCL's
        # table (or NCCL refuses it, if unusable there): every one must still sum right.
        env={"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_TUNER_PLUGIN": library_path()},
    )
    problems = failures(got)
    assert not problems, "\n".join(problems[:20])


def _ddp_matches(world_size: int, backend: str, env: dict[str, str] | None = None) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "jobs"))
    from ddp_jobs import digest, train_all

    # On NCCL, what runs there: shm's window needs CPU tensors on gloo.
    names = runnable_on("nccl/cuda") if backend == "nccl" else algorithms_under_test()
    per_rank = run_local(
        train_all, world_size, names, ["base"], "cuda", backend=backend, env=env, timeout_s=600
    )
    # register refuses an nccl.* cell NCCL does not offer here (gloo, one rank, no plugin): it
    # would run NCCL's own choice under its name. With the plugin at two ranks, NCCL offers some.
    # So is one that does not run on this backend with CUDA tensors (shm on gloo).
    refused = {t.algorithm for t in per_rank[0] if t.refused is not None}
    cells = {n for n in names if n.startswith("nccl.")}
    elsewhere = {n for n in names if f"{backend}/cuda" not in get_algorithm_class(n).runs_on}
    unable = elsewhere | (cells if world_size == 1 else set())
    assert unable <= refused <= unable | cells, (sorted(refused), sorted(unable))
    if world_size > 1 and backend == "nccl":
        assert cells - refused, f"NCCL offered none of autotune's cells: {sorted(refused)}"
    for i, t in enumerate(per_rank[0]):
        if t.refused is not None:
            continue
        for hooked, plain in zip(t.hooked, t.plain, strict=True):
            rel = float((hooked.double() - plain.double()).norm() / plain.double().norm())
            assert rel <= 1e-5, f"{t.algorithm}: {rel:.2e} from DDP without the hook"
        assert len({digest(ts[i].hooked) for ts in per_rank}) == 1, f"{t.algorithm}: ranks differ"


@needs_cuda
def test_hook_on_cuda_nccl_world_of_one() -> None:
    _ddp_matches(1, "nccl")


@needs_cuda
def test_hook_on_cuda_tensors_over_gloo() -> None:
    _ddp_matches(2, "gloo")


@needs_two_nccl_ranks
def test_hook_on_nccl_two_ranks() -> None:
    # `native` and the nccl.* cells on the hook's lane (launched on the autograd thread, futures
    # completed from NCCL's): the same gradients as DDP without the hook.
    _ddp_matches(
        2, "nccl", {"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_TUNER_PLUGIN": library_path()}
    )


def sweep_on(world_size: int, backend: str, device: str) -> None:
    """`autotune sweep` on ``device`` tensors over ``backend``, every algorithm it runs there
    (its own choice): each sums right.

    Without the broken algorithm the sweep job registers for the sweep's own check
    (tests/sweep/test_sweep.py): the sweep would run it too and count its wrong sums, as this helper
    did until it first ran on CPU (likely one of the two failures on an H200, whose reports
    were lost)."""
    from sweep_jobs import sweep

    from autotune.sweep import SweepResult

    options: dict[str, object] = {"min_bytes": 4, "max_bytes": 1 << 20, "step_factor": 16}
    options |= {"iters": 3, "warmup": 1}
    options |= {"backend": backend, "device": device, "p2p": world_size > 1}
    init = "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo"
    raw = run_local(
        sweep,
        world_size,
        options,
        None,
        False,
        backend=init,
        env={"NCCL_MULTI_RANK_GPU_ENABLE": "1"},
        timeout_s=600,
    )[0]
    result = SweepResult.from_json(raw)
    swept = {r.algorithm for r in result.rows}
    assert {"native", "ring", "tree", "two_tree"} <= swept, swept
    assert result.wrong == 0
    assert {r.wrong for r in [*result.rows, *result.p2p]} == {0}
    assert bool(result.p2p) == (world_size > 1)


def test_the_sweep_check_on_cpu() -> None:
    # What the two below run on CUDA, on the CPU: the helper itself, where CI can see it.
    sweep_on(2, "gloo", "cpu")


@needs_cuda
def test_sweep_cuda_tensors_over_gloo() -> None:
    sweep_on(2, "gloo", "cuda")


@needs_cuda
def test_sweep_nccl_world_of_one() -> None:
    sweep_on(1, "nccl", "cuda")
