"""What the iterations after a rebuilt DDP reducer cost: why a block on one drops two.

    python benchmarks/rebuild_steps.py --world-size 4 --model mlp --cycles 40

Where autotune compares reducers (the check against plain DDP, DDP's bucket sizes:
`autotune.tuning.blocks`), each switch builds the model a new reducer
(`autotune.ddp.reducer.rebuild_reducer`), and the block on it runs `BLOCK_WARMUP` iterations
untimed. This measures why: plain DDP on spawned CPU ranks (gloo, 127.0.0.1, one intra-op
thread each), ``--cycles`` times a rebuilt reducer and ``--per`` iterations on it, each
iteration's step (forward to optimizer step, the slowest rank's). Printed per position after
the rebuild: the median step, and its ratio to the median of positions 4 and later.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from autotune.comm.launch import run_local
from autotune.ddp.reducer import rebuild_reducer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_gain import MODELS, _step, model_and_batch


def job(rank: int, world_size: int, model: str, cycles: int, per: int) -> list[list[float]]:
    """Per cycle, the steps of the ``per`` iterations after a rebuild (slowest rank's)."""
    torch.set_num_threads(1)
    net, batch = model_and_batch(model)
    ddp = DDP(net, bucket_cap_mb=1.0 if model == "mlp" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for _ in range(10):  # DDP's own first iterations, and the caches warm
        _step(ddp, opt, *batch(g))
    out = []
    for _ in range(cycles):
        dist.barrier()
        rebuild_reducer(ddp)
        steps = torch.tensor([_step(ddp, opt, *batch(g)) for _ in range(per)], dtype=torch.float64)
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
        out.append(steps.tolist())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--model", choices=MODELS, default="mlp")
    p.add_argument("--cycles", type=int, default=40, help="rebuilds")
    p.add_argument("--per", type=int, default=7, help="iterations timed after each")
    args = p.parse_args()
    cycles = run_local(job, args.world_size, args.model, args.cycles, args.per, timeout_s=1800)[0]
    positions = list(zip(*cycles, strict=True))
    settled = statistics.median(s for pos in positions[3:] for s in pos)
    print(f"{args.model}, {args.world_size} ranks, {args.cycles} rebuilds:")
    for i, pos in enumerate(positions, 1):
        med = statistics.median(pos)
        print(f"  iteration {i} after the rebuild: {med * 1e3:.2f} ms, {med / settled:.3f}x")


if __name__ == "__main__":
    main()
