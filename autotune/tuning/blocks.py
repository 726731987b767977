"""Steps timed in blocks of iterations from a DDP model's forward pre-hook.

Where autotune compares DDP reducers (`autotune.tuning.buckets`: bucket sizes;
`autotune.tuning.plain_check`: the hook against none), each arm runs blocks of iterations
on a reducer of its own. A step is the time from one forward to the next; a block's figure is the
median of its `BLOCK_STEPS` timed steps, on the GPU's clock on CUDA, each the slowest rank's: the
steps are MAX-reduced over DDP's group at the block's end, in the forward pre-hook, where every
rank is at the same iteration, and the next block's clock starts after that. A block on a new
reducer first runs `BLOCK_WARMUP` iterations untimed (a rebuilt reducer runs its first iteration
in one bucket and rebuilds its buckets at the second); one on the reducer of the block before
(the second of A B B A) needs none. Every rank then holds the same figures and decides alike, so
the ranks switch reducers before the same forward without any orders.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from autotune.algorithms import bookkeeping_device
from autotune.ddp.step_clock import DeviceEvent, device_event
from autotune.util.units import count

__all__ = [
    "BLOCK",
    "BLOCKS",
    "BLOCK_STEPS",
    "BLOCK_WARMUP",
    "CLEAR_BELOW",
    "CLEAR_STEPS",
    "BlockTimer",
    "blocks",
    "check_steps_for",
]

#: Timed steps per block (a `BlockTimer`'s default); iterations untimed first, on a new reducer;
#: the most a block of the default takes.
BLOCK_STEPS = 4
BLOCK_WARMUP = 2
BLOCK = BLOCK_WARMUP + BLOCK_STEPS


def blocks(steps: int = BLOCK_STEPS) -> str:
    """How verdicts and logs name blocks of ``steps`` timed steps."""
    return f"blocks of {count(steps, 'timed step')}"


BLOCKS = blocks()

#: The check against plain DDP's block size (`check_steps_for`): `CLEAR_STEPS` timed steps
#: instead of `BLOCK_STEPS` where the plan's step over the hooked baseline's, as the paired tests
#: that put it in place measured it (`autotune.tuning.plan_search.PlanSearch.estimate`), is
#: `CLEAR_BELOW` or less. A quarter off is beyond what the hook costs over plain DDP (1-13% of a
#: small model's step on the CPU VMs: docs/TUNER.md, "Unhooking"), so the check proves such a
#: plan at its first look either way, and blocks of one timed step get there in 26 iterations
#: where blocks of 4 take 62 (docs/TUNER.md, "The check in smaller blocks where the gain is
#: clear").
CLEAR_BELOW = 0.75
CLEAR_STEPS = 1


def check_steps_for(estimate: float | None) -> int:
    """Timed steps per block of the check against plain DDP, for a plan whose step over the
    baseline's is ``estimate`` (None: not known): `CLEAR_STEPS` at or below `CLEAR_BELOW`, else
    `BLOCK_STEPS`."""
    return CLEAR_STEPS if estimate is not None and estimate <= CLEAR_BELOW else BLOCK_STEPS


class BlockTimer:
    """Times ``ddp``'s iterations, from its forward pre-hook, in blocks of ``steps`` timed
    steps (`BLOCK_STEPS` by default).

    On CUDA a step is the GPU's (`autotune.ddp.step_clock`): a CUDA event (``event``: made by
    it, for stand-ins in tests) recorded on the current stream before each forward, the time
    between consecutive ones read at the block's end, where the MAX over ranks waits for the GPU
    anyway. Elsewhere it is the host's. Its owner says when it put a new reducer in place
    (`renewed`): the block under way then begins with `BLOCK_WARMUP` untimed iterations."""

    def __init__(
        self,
        ddp: DistributedDataParallel,
        event: Callable[[], DeviceEvent] | None = None,
        steps: int = BLOCK_STEPS,
    ) -> None:
        if steps < 1:
            raise ValueError(f"a block needs at least one timed step, got {steps}")
        self._ddp = ddp
        #: Timed steps per block.
        self.steps = steps
        self._event = event if event is not None else device_event(_device(ddp))
        self._marks: list[Any] = []  # host seconds, or recorded events
        self._warmup = BLOCK_WARMUP  # the block under way's untimed iterations
        #: Iterations (forwards that all-reduce) seen so far: the comparison's cost.
        self.iterations = 0

    def counts(self) -> bool:
        """Whether the forward about to run is an iteration that all-reduces (not an eval, not
        under ``no_sync``): only those are timed, and only at those do the ranks meet."""
        return torch.is_grad_enabled() and bool(self._ddp.require_backward_grad_sync)

    def restart(self) -> None:
        """Drop the block under way: the next `tick` begins it again (its steps would span a
        pause: `autotune.ddp.join`). Call it on every rank alike."""
        self._marks.clear()
        self._warmup = BLOCK_WARMUP

    def tick(self) -> float | None:
        """Before a forward that `counts`: the step that just ended is timed. At a block's end,
        the block's median step (the slowest rank's; a collective on DDP's group), else None."""
        self._marks.append(self._mark())
        self.iterations += 1
        if len(self._marks) <= self._warmup + self.steps:
            return None
        marks = self._marks
        steps = self._steps(marks)[self._warmup :]
        block = statistics.median(self.most(steps))
        # The next block's clock starts here: after the MAX on the host's; on the GPU's, at the
        # last mark (the stream has not moved since).
        self._marks, self._warmup = [self._mark() if self._event is None else marks[-1]], 0
        return block

    def renewed(self) -> None:
        """A new reducer is in place, before the block under way's first forward: that block
        begins with `BLOCK_WARMUP` untimed iterations."""
        self._warmup = BLOCK_WARMUP

    @property
    def most_iterations(self) -> int:
        """The iterations a block takes at most: on a new reducer, its untimed ones first."""
        return BLOCK_WARMUP + self.steps

    def _mark(self) -> Any:
        if self._event is None:
            return time.perf_counter()
        mark = self._event()
        mark.record()  # on the current stream, before the next forward's kernels
        return mark

    def _steps(self, marks: list[Any]) -> list[float]:
        if self._event is None:
            return [b - a for a, b in itertools.pairwise(marks)]
        marks[-1].synchronize()  # the block's last forward reached on the GPU: all are timed
        return [a.elapsed_time(b) / 1000.0 for a, b in itertools.pairwise(marks)]

    def most(self, values: list[float]) -> list[float]:
        """``values``, each the largest over the ranks of DDP's group."""
        ddp = self._ddp
        device = bookkeeping_device(ddp.process_group, _device(ddp))
        row = torch.tensor(values, dtype=torch.float64).to(device)
        dist.all_reduce(row, op=dist.ReduceOp.MAX, group=ddp.process_group)
        out: list[float] = row.cpu().tolist()
        return out


def _device(ddp: DistributedDataParallel) -> torch.device:
    for p in ddp.module.parameters():
        device: torch.device = p.device
        return device
    return torch.device("cpu")
