"""Uneven inputs under DDP's ``Join`` in each phase of ``auto`` (tests/ddp/test_join.py):
importable by the ranks."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
from ddp_jobs import Net
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune

#: Batches each rank trains under Join (the issue's 220, 60 and 140, scaled down): rank 1 joins
#: first, then rank 2; rank 0 goes on alone past several blocks of `autotune.tuning.blocks`.
UNEVEN = (44, 12, 28)
#: The issue's 220 and 140, where the tuner must unhook under the Join after rank 1 has joined:
#: rank 1 joins after 4 batches, before any tuner can have decided (at 59 to 224 iterations
#: here: how soon depends on the machine's load). Rank 0 goes on past its 220 until autotune has
#: unhooked (`MAX_LONG` at most), so the unhook falls inside the Join however loaded the machine.
LONG = (220, 4, 140)
MAX_LONG = 2000


@dataclass
class Joined:
    """What one rank saw."""

    phase_at: int  # the even step at which the phase was reached (and the Join began)
    rel: float  # the largest relative distance from plain DDP's parameters, at the end
    held: int  # forwards autotune's pre-hook held while the Join was open
    unhooked_at: int | None  # where autotune unhooked (None: it did not)
    #: Iterations the check against plain DDP, or DDP's bucket-size search, ran after the Join.
    went_on: int
    seconds: float  # the Join with autotune, on this rank
    batches: int  # batches this rank trained under the Join


class BigNet(torch.nn.Module):
    """2.2 MB of gradients: more than DDP's 1 MiB first bucket, so DDP's bucket-size search has a
    size to try (1 MiB buckets); `Net`'s 23 KB make one bucket at every size.

    Smooth (tanh, not ReLU): DDP's bucket-size search sums in another bucket layout than the
    plain DDP copy, so the two differ by rounding (1e-7), and a ReLU whose input sits that close
    to 0 flips and turns it into a jump. Measured with plain DDP alone (25 MiB against 1 MiB
    buckets, 3 ranks, 130 steps): with ReLU 1 seed in 40 ended 9e-5 apart, at one step; with
    tanh 80 of 80 within 1e-6. A lost or doubled contribution is still far beyond 1e-5."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(16, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 512),
            torch.nn.Tanh(), torch.nn.Linear(512, 4),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out


def _reached(state: autotune.AutotuneState, phase: str, ddp: DDP) -> bool:
    """Whether ``state`` is in ``phase`` now: the same on every rank after the same step."""
    unhooking = state.unhooking
    if phase in ("screening", "unhook after a rank joined"):
        return True
    assert unhooking is not None
    if phase == "unhook due":  # a plan file that unhooks after the first iteration
        return True
    if phase == "catch":  # the check against plain DDP, in a block without the hook
        catch = unhooking.catch
        return catch is not None and not catch.over and not ddp._comm_hooks
    if phase == "buckets":  # DDP's bucket-size search under way
        return unhooking.buckets is not None and unhooking.buckets.search is not None
    if phase == "unhooked":  # unhooked, nothing left to decide
        return unhooking.at is not None and unhooking.buckets is None
    raise ValueError(phase)


def uneven(
    rank: int, world_size: int, phase: str, config: dict[str, Any], after: int = 40
) -> Joined:
    """Train `Net` with autotune and a plain DDP copy on the same batches: evenly until autotune
    is in ``phase``, then each under ``with Join([model])`` with `UNEVEN` batches per rank, then
    evenly for ``after`` more steps."""
    torch.manual_seed(0)
    base = BigNet() if phase == "buckets" else Net()
    ours, plain = DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base))
    state = autotune.register(ours, autotune.Config(**config))
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.05) for m in (ours, plain)}
    g = torch.Generator().manual_seed(rank)

    def step(model: DDP, x: torch.Tensor, y: torch.Tensor) -> None:
        opt = opts[id(model)]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)

    at = 0
    while not _reached(state, phase, ours):
        x, y = batch()
        step(ours, x, y)
        step(plain, x, y)
        at += 1
        assert at < 2000, f"never reached {phase}"
    long = phase == "unhook after a rank joined"
    counts = LONG if long else UNEVEN
    batches = [batch() for _ in range(counts[rank])]
    began = time.monotonic()
    with Join([ours]):
        for x, y in batches:
            step(ours, x, y)
        while long and rank == 0 and _still_hooked(state) and len(batches) < MAX_LONG:
            batches.append(batch())
            step(ours, *batches[-1])
    seconds = time.monotonic() - began
    with Join([plain]):  # the same batches, for plain DDP
        for x, y in batches:
            step(plain, x, y)
    unhooking = state.unhooking
    held = 0 if unhooking is None else unhooking.held
    before = _iterations(state)
    for _ in range(after):
        x, y = batch()
        step(ours, x, y)
        step(plain, x, y)
    rel = max(
        float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())
        for a, b in zip(ours.parameters(), plain.parameters(), strict=True)
    )
    joined = Joined(
        at,
        rel,
        held,
        None if unhooking is None else unhooking.at,
        _iterations(state) - before,
        seconds,
        len(batches),
    )
    state.close()
    return joined


def _still_hooked(state: autotune.AutotuneState) -> bool:
    """Whether autotune has not unhooked yet."""
    return state.unhooking is None or state.unhooking.at is None


def _iterations(state: autotune.AutotuneState) -> int:
    """Iterations the check against plain DDP and DDP's bucket-size search have run so far."""
    unhooking = state.unhooking
    if unhooking is None:
        return 0
    catch, buckets = unhooking.catch, unhooking.buckets
    return (0 if catch is None else catch.iterations) + (
        0 if buckets is None else buckets.iterations
    )
