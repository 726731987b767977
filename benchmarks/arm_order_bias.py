"""The paired benchmarks' own bias: two identical plain DDP arms, with noop_hook between them.

    python benchmarks/arm_order_bias.py --world-size 4 --model mlp --steps 120

Three arms take turns step by step in step_gain.py's rotating order: plain DDP, DDP with
``noop_hook``, and a second plain DDP in the third place (where step_gain.py puts autotune). The
two plain arms are the same job, so their ratio should be 1 within noise. It is run twice: as
step_gain.py ran before, and with every rank aligned (an untimed barrier) before each arm's step,
as it runs now. A ``noop_hook`` step all-reduces nothing, so the ranks leave it as skewed as their
compute was; the arm after it waits that skew out in its first all-reduce.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from autotune.comm.launch import run_local
from autotune.tuning.paired_test import median_interval

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_gain import MODELS, _step, model_and_batch


def rotation(rank: int, world_size: int, args: argparse.Namespace, barrier: bool) -> list[float]:
    """Per step, the second plain arm's time over the first's (slowest rank)."""
    torch.set_num_threads(args.threads)
    model, batch = model_and_batch(args.model)
    options: dict[str, Any] = {"bucket_cap_mb": 1.0} if args.model == "mlp" else {}
    arms = {name: DDP(copy.deepcopy(model), **options) for name in ("plain", "noop", "plain2")}
    arms["noop"].register_comm_hook(None, noop_hook)
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in arms.items()}
    times: dict[str, list[float]] = {k: [] for k in arms}
    order = list(arms)
    g = torch.Generator().manual_seed(rank)
    for step in range(10 + args.steps):
        x, y = batch(g)
        for name in order[step % 3 :] + order[: step % 3]:
            if barrier:
                dist.barrier()
            seconds = _step(arms[name], opts[name], x, y)
            if step >= 10:
                times[name].append(seconds)
    t = torch.tensor([times["plain2"], times["plain"]], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ratios: list[float] = (t[0] / t[1]).tolist()
    return ratios


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--model", default="mlp", choices=MODELS)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    args = p.parse_args(argv)
    for barrier in (False, True):
        ratios = run_local(rotation, args.world_size, args, barrier, timeout_s=1800)[0]
        low, high = median_interval(ratios)
        print(
            f"{args.model} x{args.world_size}, {'aligned' if barrier else 'not aligned'}: second "
            f"plain / first {statistics.median(ratios):.3f} (95% interval {low:.3f}-{high:.3f}, "
            f"{len(ratios)} steps)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
