"""How much of the hook's communication hides behind backward: a measurement, not a test.

    python benchmarks/overlap.py --world-size 2 --steps 8

Each rank trains a 6-layer MLP of width 512 (batch 1024) with a ring slowed by 10 ms per message,
so communication is long enough to see, and times: backward of the bare model (compute alone),
the hook's messages end to end (communication alone), and a step with DDP and the hook. Without
overlap a step would take compute + communication; the hidden share is what the step saves.
The test suite checks that overlap exists with events (tests/ddp/test_hook.py); this measures it.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.algorithms import Comm, RingAllReduce, register
from autotune.comm.launch import run_local


class DelayedRing(RingAllReduce):
    """A ring that sleeps first: communication slow enough to watch it overlap backward."""

    name = "delayed_ring"
    delay_s = 0.01

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        time.sleep(self.delay_s)
        super()._run(buf, comm, segment_elems)


@dataclass
class Overlap:
    compute_s: float  # forward + backward of the bare model, no communication at all
    comm_s: float  # the hook's messages in one step, end to end
    step_s: float  # forward + backward with DDP and the hook (backward waits for the futures)
    messages_per_step: float
    finished_during_backward: int  # messages complete before backward's last bucket was ready


def overlap(rank: int, world_size: int, steps: int) -> Overlap:
    """Median step times with the hook against compute alone and communication alone."""
    register("delayed_ring", DelayedRing)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    bare = torch.nn.Sequential(*layers)
    ddp = DDP(copy.deepcopy(bare), bucket_cap_mb=1)
    state = autotune.register(ddp, autotune.Config(algorithm="delayed_ring", timeout_s=60))
    x = torch.randn(1024, 512)

    def timed(model: torch.nn.Module) -> float:
        start = time.perf_counter()
        model(x).square().mean().backward()
        return time.perf_counter() - start

    compute, step, comm, during = [], [], [], []
    for i in range(steps + 2):
        c = timed(bare)
        dist.barrier()
        s = timed(ddp)
        if i < 2:  # warm-up, and DDP rebuilds its buckets after the first iteration
            continue
        compute.append(c)
        step.append(s)
        state.engine.settle(60)  # its records are written after the futures complete
        mine = [r for r in state.recorder.records() if r.iteration == i]
        comm.append(max(r.started + r.seconds for r in mine) - min(r.started for r in mine))
        last_bucket = max(t for t, _ in state.recorder.hook_calls()[-len(mine) :])
        during.append(sum(r.started + r.seconds < last_bucket for r in mine))
    n = len(state.recorder.records())
    state.close()
    med = statistics.median
    return Overlap(med(compute), med(comm), med(step), n / (steps + 2), min(during))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    for rank, r in enumerate(run_local(overlap, args.world_size, args.steps)):
        hidden = r.compute_s + r.comm_s - r.step_s
        print(
            f"rank {rank}: backward {r.compute_s * 1e3:.0f} ms, communication "
            f"{r.comm_s * 1e3:.0f} ms, step {r.step_s * 1e3:.0f} ms: "
            f"{hidden / r.comm_s:.0%} of communication hidden, "
            f"{r.finished_during_backward} messages done before backward's last bucket"
        )


if __name__ == "__main__":
    main()
