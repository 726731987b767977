"""Jobs the tuner tests run on spawned ranks, and algorithms with injected delays."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
from ddp_jobs import digest
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.algorithms import Comm, RingAllReduce, register

#: Messages up to this many bytes are "small" for the size-dependent algorithms below.
SMALL_BYTES = 100_000
DELAY_S = 0.03


class SlowRing(RingAllReduce):
    """A working ring with an injected delay: the tuner must stop choosing it."""

    name = "slow_ring"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        time.sleep(DELAY_S)
        super()._run(buf, comm, segment_elems)


class FastSmall(RingAllReduce):
    """A ring that is slow for large messages only."""

    name = "fast_small"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        if buf.numel() * buf.element_size() > SMALL_BYTES:
            time.sleep(DELAY_S)
        super()._run(buf, comm, segment_elems)


class FastLarge(RingAllReduce):
    """A ring that is slow for small messages only."""

    name = "fast_large"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        if buf.numel() * buf.element_size() <= SMALL_BYTES:
            time.sleep(DELAY_S)
        super()._run(buf, comm, segment_elems)


def model() -> torch.nn.Module:
    """With bucket_cap_mb=0.05, two buckets either side of SMALL_BYTES from the second iteration
    (after DDP rebuilds them): 66 KB and 1.05 MB."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 8),
    )


BUCKET_CAP_MB = 0.05


@dataclass
class Tuned:
    plan: dict[int, autotune.Choice]
    fusion_bytes: int
    progress: dict[Any, Any]
    messages: list[tuple[int, int, str, int | None]]  # (iteration, bytes, algorithm, segment)
    hooked: str  # digest of the parameters
    plain_rel: float  # largest relative distance from DDP without the hook, per parameter
    settled: bool


def tune(rank: int, world_size: int, steps: int, config: dict[str, Any], compare: bool) -> Tuned:
    """Train with the tuner on (and, if ``compare``, beside DDP without a hook)."""
    for cls in (SlowRing, FastSmall, FastLarge):
        register(cls.name, cls, replace=True)
    base = model()
    hooked = DDP(copy.deepcopy(base), bucket_cap_mb=BUCKET_CAP_MB)
    state = autotune.register(hooked, autotune.Config(timeout_s=60, **config))
    models = (
        [hooked, DDP(copy.deepcopy(base), bucket_cap_mb=BUCKET_CAP_MB)] if compare else [hooked]
    )
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x, y = torch.randn(32, 256, generator=g), torch.randint(0, 8, (32,), generator=g)
        for m, opt in zip(models, optimizers, strict=True):
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert state.tuner is not None
    rel = 0.0
    if compare:
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
            rel = max(rel, float((a.double() - b.double()).norm() / b.double().norm()))
    result = Tuned(
        plan=state.plan(),
        fusion_bytes=state.engine.fusion_bytes,
        progress=state.tuner.progress() if rank == 0 else {},
        messages=[
            (r.iteration, r.nbytes, r.algorithm, r.segment_bytes) for r in state.recorder.records()
        ],
        hooked=digest(list(hooked.parameters())),
        plain_rel=rel,
        settled=state.tuner.settled,
    )
    state.close()
    return result


def fixed_from_file(
    rank: int, world_size: int, plan_file: str
) -> tuple[bool, set[str], dict[int, Any]]:
    """Config(plan_file=...): the table's choices, no tuner."""
    state_holder = DDP(model(), bucket_cap_mb=BUCKET_CAP_MB)
    state = autotune.register(state_holder, autotune.Config(plan_file=plan_file))
    opt = torch.optim.SGD(state_holder.parameters(), lr=0.05)
    for _ in range(4):
        x, y = torch.randn(8, 256), torch.randint(0, 8, (8,))
        torch.nn.functional.cross_entropy(state_holder(x), y).backward()
        opt.step()
        opt.zero_grad()
    used = {r.algorithm for r in state.recorder.records() if r.iteration >= 1}
    result = (state.tuner is None, used, state.plan())
    state.close()
    return result


def register_with_plan_file(rank: int, world_size: int, plan_file: str) -> str:
    """Register with ``plan_file``; the error register raises (no step is taken)."""
    try:
        autotune.register(DDP(model()), autotune.Config(plan_file=plan_file)).close()
    except ValueError as exc:
        return str(exc)
    return "no error"
