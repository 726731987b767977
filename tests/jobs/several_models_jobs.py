"""Several hooked DDP models in one process (tests/ddp/test_several_models.py): importable by the
ranks."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune


def _shapes(count: int) -> list[torch.nn.Module]:
    """``count`` models of different shapes and bucket counts (each input 16 wide)."""
    made: list[torch.nn.Module] = [
        torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)),
        torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3)),
        torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)),
    ]
    return made[:count]


def several_models(
    rank: int,
    world_size: int,
    algorithms: list[str],
    count: int,
    together: bool,
    steps: int,
    settings: dict[str, Any] | None = None,
) -> dict[str, tuple[float, list[set[str]], float]]:
    """Per algorithm: ``count`` DDP models of different shapes, each registered with a state of
    its own on ``algorithm``, trained ``steps`` steps beside plain DDP copies on the same batches,
    with one backward through them all (``together``) or one backward per model in turn: the
    largest relative distance between a hooked model's parameters and its plain copy's, per
    model the algorithms its messages ran, and the seconds the hooked models' steps took."""
    out: dict[str, tuple[float, list[set[str]], float]] = {}
    for algorithm in algorithms:
        torch.manual_seed(0)
        bases = _shapes(count)
        # Small buckets: several messages per model, so the models' messages interleave.
        ours = [DDP(copy.deepcopy(b), bucket_cap_mb=0.01) for b in bases]
        plain = [DDP(copy.deepcopy(b), bucket_cap_mb=0.01) for b in bases]
        config = autotune.Config(algorithm=algorithm, timeout_s=60, **(settings or {}))
        states = [autotune.register(m, config) for m in ours]
        opts = [torch.optim.SGD([*m.parameters()], lr=0.05) for m in (*ours, *plain)]
        g = torch.Generator().manual_seed(rank)
        seconds = 0.0
        for _ in range(steps):
            x = torch.randn(8, 16, generator=g)
            for opt in opts:
                opt.zero_grad()
            for models in (ours, plain):
                began = time.monotonic()
                if together:
                    sum(m(x).square().mean() for m in models).backward()
                else:
                    for m in models:
                        m(x).square().mean().backward()
                if models is ours:
                    seconds += time.monotonic() - began
            for opt in opts:
                opt.step()
        rel = max(
            float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())
            for mine, theirs in zip(ours, plain, strict=True)
            for a, b in zip(mine.parameters(), theirs.parameters(), strict=True)
        )
        ran = [{name for _, name in state.stats()} for state in states]
        assert all(state.engine.iteration == steps for state in states)
        out[algorithm] = (rel, ran, seconds)
        for state in states:
            state.close()
    return out
