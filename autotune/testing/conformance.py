"""The conformance suite every registered all-reduce algorithm must pass, plugins included.

`run_conformance` spawns real ranks on gloo over 127.0.0.1 and runs every case on every named
algorithm; `failures` turns the outcomes into readable complaints. A plugin's own tests can call
both for its algorithms, exactly as autotune's suite does for the built-ins.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from autotune.algorithms import SUPPORTED_DTYPES, available, get_algorithm, register
from autotune.comm.launch import run_local

__all__ = [
    "Case",
    "Outcome",
    "algorithms_under_test",
    "cases",
    "error_bound",
    "failures",
    "hookable_on_gloo",
    "make_input",
    "reference",
    "run_conformance",
    "run_in_group",
    "runnable_on",
]


#: What stands for NCCL's own algorithm x protocol combinations (autotune-nccl's "nccl.*").
NCCL_COMBINATION = "nccl.ring.simple"


def runnable_on(where: str, names: Sequence[str] | None = None) -> list[str]:
    """``names`` (default: every registered algorithm) whose class says it runs on ``where``
    ("nccl/cuda", "gloo/cpu", ...: `AllReduceAlgorithm.runs_on`); ``shm``, for one, runs on
    gloo with CPU tensors only."""
    from autotune.algorithms import get_algorithm_class

    return [
        n
        for n in (available() if names is None else names)
        if where in get_algorithm_class(n).runs_on
    ]


def algorithms_under_test() -> list[str]:
    """Every registered algorithm, with one of NCCL's combinations standing for all: on gloo
    none of them steers anything (no NCCL asks the plugin), so each runs the backend's own
    all-reduce, and twenty copies of one check would only take time."""
    return [a for a in available() if not a.startswith("nccl.") or a == NCCL_COMBINATION]


def hookable_on_gloo() -> list[str]:
    """`algorithms_under_test` that register accepts on gloo: NCCL's combinations are refused
    there (no NCCL asks the plugin: they would run gloo's own all-reduce under their name)."""
    return [a for a in algorithms_under_test() if not a.startswith("nccl.")]


@dataclass(frozen=True)
class Case:
    """One all-reduce to run: how many elements, of what dtype, in what shape, which segment."""

    numel: int
    dtype: torch.dtype
    segment_bytes: int | None = None  # None: the algorithm's default
    cols: int = 1  # the tensor is (numel // cols, cols): >1 checks that shape survives

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.numel,) if self.cols == 1 else (self.numel // self.cols, self.cols)

    def __str__(self) -> str:
        seg = "default" if self.segment_bytes is None else f"{self.segment_bytes}B"
        return f"{self.numel}x{str(self.dtype).removeprefix('torch.')} shape={self.shape} seg={seg}"


@dataclass(frozen=True)
class Outcome:
    """What one rank saw for one (algorithm, case)."""

    algorithm: str
    case: Case
    rank: int
    digest: str | None = None  # SHA-256 of the result's bytes
    worst: float = 0.0  # max over elements of |result - reference| / bound; <= 1 passes
    in_place: bool = True  # same storage and shape as the input
    error: str | None = None  # the exception, if the call raised
    seconds: float = 0.0


def cases(world_size: int, seed: int = 0) -> list[Case]:
    """The cases for one world size: empty, one element, fewer than N, not divisible by N, larger
    random sizes; every supported dtype; default and small, uneven segments."""
    rng = random.Random(seed * 1009 + world_size)
    n = world_size
    sizes = sorted(
        {
            0,
            1,
            max(n - 1, 1),
            n + 1,
            2 * n + 3,
            rng.randrange(300, 3000),
            rng.randrange(20_000, 60_000),
        }
    )
    out: list[Case] = []
    for dtype in SUPPORTED_DTYPES:
        item = torch.empty((), dtype=dtype).element_size()
        for numel in sizes:
            out.append(Case(numel, dtype))
            if numel > n:
                # Segments that are not a whole number of elements, nor divide the chunks evenly.
                elems = 3 if numel < 100 else 257 if numel < 10_000 else 2053
                out.append(Case(numel, dtype, segment_bytes=elems * item + 1))
        out.append(Case(4 * (n + 2), dtype, cols=4))
    return out


def make_input(case: Case, rank: int, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: any rank can rebuild every rank's, so each can check the sum."""
    # crc32, not hash(): str hashes are salted per process, and every rank must agree.
    g = torch.Generator().manual_seed(
        zlib.crc32(f"{seed}:{rank}:{case.numel}:{case.dtype}".encode())
    )
    # Ranks differ in scale, so a dropped or doubled contribution shows far above the bound.
    x = torch.randn(case.numel, generator=g, dtype=torch.float64) * (1 + rank)
    return x.to(case.dtype).reshape(case.shape)


def reference(case: Case, world_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact sum of every rank's input (correctly rounded to float64), and of their magnitudes.

    math.fsum, not a float64 sum: for float64 inputs a plain float64 sum is itself off by up to
    the bound the algorithms are held to.
    """
    inputs = [make_input(case, r, seed).reshape(-1).tolist() for r in range(world_size)]
    columns = zip(*inputs, strict=True)
    total, magnitude = [], []
    for col in columns:
        total.append(math.fsum(col))
        magnitude.append(math.fsum(abs(v) for v in col))
    return (
        torch.tensor(total, dtype=torch.float64).reshape(case.shape),
        torch.tensor(magnitude, dtype=torch.float64).reshape(case.shape),
    )


def error_bound(magnitude: torch.Tensor, dtype: torch.dtype, world_size: int) -> torch.Tensor:
    """How far a correct N-input sum may be from `reference`, element by element.

    Summing N numbers in any order (ring, tree, whatever) takes N-1 additions, each rounding with
    relative error at most u = eps/2, so |computed - exact| <= gamma(N-1) * sum|x_i| with
    gamma(k) = k*u / (1 - k*u) (Higham, Accuracy and Stability of Numerical Algorithms, ch. 4).
    fp16 (u = 2^-11) and bf16 (u = 2^-8) get the same bound with their own u: it is as tight for
    them as for fp32, so a wrong order of operations or a lost addend still fails. The reference
    itself is the exact sum rounded once to float64 (2^-53 relative), and underflow adds at most
    half the smallest subnormal per addition.
    """
    info = torch.finfo(dtype)
    u = info.eps / 2
    k = max(world_size - 1, 0)
    gamma = k * u / (1 - k * u)
    reference_rounding = torch.finfo(torch.float64).eps / 2
    return (gamma + reference_rounding) * magnitude + k * info.smallest_normal * info.eps


def _digest(t: torch.Tensor) -> str:
    raw = t.detach().contiguous().view(-1).view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def _rank(
    rank: int,
    world_size: int,
    names: Sequence[str],
    all_cases: Sequence[Case],
    seed: int,
    extra: Mapping[str, str],
    timeout_s: float,
    device: str,
    node_of: Sequence[int] | None,
) -> list[Outcome]:
    import importlib
    import os

    from autotune.comm.topology import NODE_ID_ENV

    if node_of is not None:  # emulated nodes: the ranks' own node ids say who shares one
        os.environ[NODE_ID_ENV] = f"conformance-node-{node_of[rank]}"
    if device == "cuda":
        # Ranks may share one GPU (gloo with CUDA tensors, or NCCL_MULTI_RANK_GPU_ENABLE=1).
        torch.cuda.set_device(rank % torch.cuda.device_count())

    for name, target in extra.items():
        module, _, attr = target.partition(":")
        register(name, getattr(importlib.import_module(module), attr), replace=True)
    exact = functools.cache(lambda case: reference(case, world_size, seed))
    outcomes = []
    for name in names:
        algo = get_algorithm(name, timeout_s=timeout_s)
        for case in all_cases:
            x = make_input(case, rank, seed).to(device)
            ptr = x.data_ptr()
            start = time.perf_counter()
            try:
                algo.all_reduce(x, segment_bytes=case.segment_bytes)
                if x.is_cuda:
                    torch.cuda.synchronize()
            except Exception as exc:
                outcomes.append(Outcome(name, case, rank, error=f"{type(exc).__name__}: {exc}"))
                continue
            seconds = time.perf_counter() - start
            in_place = x.data_ptr() == ptr and tuple(x.shape) == case.shape
            x = x.cpu()
            total, magnitude = exact(case)
            bound = error_bound(magnitude, case.dtype, world_size)
            err = (x.double() - total).abs()
            # Where the bound is zero (all inputs zero) any error is a failure: divide by tiny.
            worst = float((err / bound.clamp_min(1e-300)).max()) if case.numel else 0.0
            if not torch.isfinite(x).all():
                worst = float("inf")
            outcomes.append(
                Outcome(
                    name,
                    case,
                    rank,
                    digest=_digest(x),
                    worst=worst,
                    in_place=in_place,
                    seconds=seconds,
                )
            )
    return outcomes


def run_conformance(
    world_size: int,
    names: Sequence[str],
    *,
    seed: int = 0,
    case_list: Sequence[Case] | None = None,
    extra: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    device: str = "cpu",
    backend: str = "gloo",
    env: Mapping[str, str] | None = None,
    node_of: Sequence[int] | None = None,
    setup: Callable[[], None] | None = None,
) -> list[Outcome]:
    """Run every case on every algorithm in ``names`` across ``world_size`` spawned ranks.

    ``extra`` registers more algorithms in the ranks first, name -> "module:Class" (the module must
    be importable there). All ranks run the same calls in the same order; each rank checks its
    result against the exact reference itself. ``device="cuda"`` runs on CUDA tensors (ranks
    share GPUs round-robin), over ``backend`` "gloo" (staged through host memory) or "nccl".
    ``node_of``: the node of each rank, to check topology-aware algorithms on a layout one host
    cannot have (the ranks name their nodes through `autotune.comm.topology.NODE_ID_ENV`); None: as
    the ranks find themselves. ``setup``: run in each rank before its group (`autotune.comm.launch`:
    `autotune.testing.played_nccl.install` for ``backend="played_nccl"``).
    """
    if node_of is not None and len(node_of) != world_size:
        raise ValueError(f"node_of names {len(node_of)} ranks' nodes, the world has {world_size}")
    chosen = list(case_list) if case_list is not None else cases(world_size, seed)
    per_rank = run_local(
        _rank,
        world_size,
        list(names),
        chosen,
        seed,
        dict(extra or {}),
        timeout_s,
        device,
        None if node_of is None else list(node_of),
        timeout_s=max(300.0, 4 * timeout_s),
        backend=backend,
        env=env,
        setup=setup,
    )
    return [o for outcomes in per_rank for o in outcomes]


def run_in_group(
    names: Sequence[str],
    *,
    seed: int = 0,
    case_list: Sequence[Case] | None = None,
    timeout_s: float = 60.0,
    device: str = "cpu",
) -> list[Outcome]:
    """`run_conformance` for ranks another launcher started (torchrun, across nodes): run on
    this rank, in the default process group; gather every rank's outcomes for `failures`."""
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    chosen = list(case_list) if case_list is not None else cases(world_size, seed)
    return _rank(rank, world_size, list(names), chosen, seed, {}, timeout_s, device, None)


def failures(outcomes: Sequence[Outcome]) -> list[str]:
    """Every way ``outcomes`` break the contract, one line each; empty when all is well."""
    problems = []
    groups: dict[tuple[str, Case], list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault((o.algorithm, o.case), []).append(o)
    for (name, case), group in groups.items():
        where = f"{name} [{case}]"
        for o in group:
            if o.error is not None:
                problems.append(f"{where} rank {o.rank} raised {o.error}")
            elif o.worst > 1.0:
                problems.append(
                    f"{where} rank {o.rank}: off the exact sum by {o.worst:.3g}x the error bound"
                )
            elif not o.in_place:
                problems.append(f"{where} rank {o.rank}: result not in the input tensor")
        digests = {o.digest for o in group if o.error is None}
        if len(digests) > 1:
            problems.append(f"{where}: ranks disagree bitwise ({len(digests)} distinct results)")
    return problems
