"""Jobs the compression tests run on spawned ranks (importable by the ranks)."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

from autotune.algorithms import WIRES, get_algorithm
from autotune.ddp.engine import Engine
from autotune.ddp.messages import CAST_SAMPLE_EVERY
from autotune.ddp.stats import MessageRecord
from autotune.plan import Choice, Plan
from autotune.testing.conformance import error_bound


def compressed_means(
    rank: int, world_size: int, algorithms: list[str], scale: float = 1.0
) -> dict[str, dict[str, Any]]:
    """Per ``algorithm+wire``: a 3000-element fp32 bucket averaged through the engine on that
    compressed wire, against the exact mean: the largest error over its bound (the wire's
    rounding: the cast, then a sum in the wire dtype), whether the result is the wire's (each
    element representable in it: the sum travelled cast), whether it is finite, what the records
    call it, and the cast errors sampled."""
    torch.manual_seed(rank)
    grad = torch.randn(3000, dtype=torch.float32) * scale + scale / 2
    exact = grad.double()
    magnitude = grad.double().abs()
    for t in (exact, magnitude):
        dist.all_reduce(t)
    exact /= world_size
    magnitude /= world_size
    out: dict[str, dict[str, Any]] = {}
    for name in algorithms:
        for wire, dtype in WIRES.items():
            records: list[MessageRecord] = []
            engine = Engine(
                group=dist.group.WORLD,  # type: ignore[arg-type]
                world_size=world_size,
                plan=Plan(Choice(name, None, wire)),
                algorithm_for=lambda n: get_algorithm(n, timeout_s=60),
            )
            engine.subscribe(functools.partial(_keep, records))
            try:
                for _ in range(CAST_SAMPLE_EVERY + 1):  # every rank the same number of messages
                    result = engine.submit(grad.clone(), is_last=True).wait()
                engine.settle(60)
            finally:
                engine.close()
            u = torch.finfo(dtype).eps / 2
            bound = error_bound(magnitude, dtype, world_size) + u * magnitude * 1.001 + 1e-30
            out[f"{name}+{wire}"] = {
                "over_bound": float(((result.double() - exact).abs() / bound).max()),
                "the_wires": bool(torch.equal(result.to(dtype).to(result.dtype), result)),
                "finite": bool(torch.isfinite(result).all()),
                "labels": sorted({r.algorithm for r in records}),
                "cast_errors": [r.cast_error for r in records if r.cast_error is not None],
                "dtype": str(result.dtype),
            }
    return out


def _keep(records: list[MessageRecord], event: object) -> None:
    if isinstance(event, MessageRecord):
        records.append(event)


def tuned_labels(
    rank: int, world_size: int, compression: tuple[str, ...], storage: str
) -> list[str]:
    """A small model tuned for 120 steps with ``compression`` allowed: what its messages ran as
    (`state.stats()`'s labels, ``ring+bf16`` on a compressed wire)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import autotune

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Linear(256, 8)))
    config = autotune.Config(
        algorithms=("ring", "native"),
        compression=compression,
        fusion_bytes=0,
        tune_warmup=0,
        tune_samples=1,
        storage=storage,
        timeout_s=60,
    )
    state = autotune.register(model, config)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for _ in range(120):
        opt.zero_grad()
        model(torch.randn(16, 32, generator=g)).sum().backward()
        opt.step()
    labels = sorted({algorithm for _, algorithm in state.stats()})
    state.close()
    return labels


def resumed_labels(
    rank: int, world_size: int, compression: tuple[str, ...], storage: str
) -> list[str]:
    """`Net` for 40 steps as the workload `storage_with_a_ring_plan` stored (``ring+bf16``),
    ``compression`` allowed: what its messages ran as."""
    from ddp_jobs import Net, train_steps
    from fault_jobs import RING_WORKLOAD
    from torch.nn.parallel import DistributedDataParallel as DDP

    import autotune

    model = DDP(Net())
    config = autotune.Config(
        algorithms=("ring", "native"),
        compression=compression,
        workload=RING_WORKLOAD,
        tune_warmup=0,
        tune_samples=1,
        storage=storage,
        timeout_s=60,
    )
    state = autotune.register(model, config)
    train_steps(model, 40)
    labels = sorted({algorithm for _, algorithm in state.stats()})
    state.close()
    return labels
