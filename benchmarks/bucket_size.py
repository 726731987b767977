"""DDP's own bucket size against the hook's fusion of the same buckets, on the training step.

    python benchmarks/bucket_size.py --world-size 2 --model mlp --caps 1,4,16,25 --fusions 0,4,16

Each rank trains identical copies of one of step_gain.py's models, taking turns step by step on
the same batches (a rotating order, every rank aligned by an untimed barrier before each step):
plain DDP at each ``--caps`` bucket size (MiB; the first is the reference), and DDP at the
model's usual buckets (the mlp's 1 MiB, DDP's default otherwise) with autotune's hook fixed on
the backend's all-reduce at each ``--fusions`` size (MiB, 0: DDP's buckets as they are).
Reported: each arm's median step over the reference's, per step, slowest rank, with the sign
test's 95% interval. Why `autotune.tuning.buckets` tunes DDP's bucket size rather than fusing
through the hook once it unhooks.

With ``--block N`` the arms take turns in blocks of N steps instead, with no barrier, as a job
runs (and as `autotune.tuning.buckets` compares sizes): the first `BLOCK_WARMUP` steps of each block
are not timed, a block's value is the median of its other steps (per step, the slowest rank's),
and each round's blocks are compared with the reference's block of the same round. The barrier
lines the ranks up before every step; without it, a rank that finished early starts its next
forward while the other still runs backward, and what the bucket size saves can differ.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.comm.launch import run_local
from autotune.tuning.blocks import BLOCK_WARMUP
from autotune.tuning.paired_test import median_interval

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_gain import MODELS, _slowest, _step, model_and_batch


def _rank(rank: int, world_size: int, args: argparse.Namespace) -> dict[str, list[float]]:
    torch.set_num_threads(args.threads)
    model, batch = model_and_batch(args.model)
    usual: dict[str, Any] = {"bucket_cap_mb": 1.0} if args.model == "mlp" else {}
    arms: dict[str, DDP] = {}
    states = []
    for cap in args.caps:
        arms[f"DDP, {cap:g} MiB buckets"] = DDP(copy.deepcopy(model), bucket_cap_mb=cap)
    for fusion in args.fusions:
        ddp = DDP(copy.deepcopy(model), **usual)
        config = autotune.Config(algorithm="native", fusion_bytes=int(fusion * 2**20))
        states.append(autotune.register(ddp, config))
        arms[f"hook, fusion {fusion:g} MiB" if fusion else "hook, DDP's buckets"] = ddp
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in arms.items()}
    g = torch.Generator().manual_seed(rank)
    order = list(arms)
    if args.block:
        out = _blocks(arms, opts, order, batch, g, args)
    else:
        times: dict[str, list[float]] = {k: [] for k in arms}
        for step in range(args.warmup + args.steps):
            x, y = batch(g)
            k = step % len(order)
            for name in order[k:] + order[:k]:
                dist.barrier()
                t = _step(arms[name], opts[name], x, y)
                if step >= args.warmup:
                    times[name].append(t)
        out = {k: _slowest(v) for k, v in times.items()}
    for state in states:
        state.close()
    return out


def _blocks(
    arms: dict[str, DDP],
    opts: dict[str, torch.optim.SGD],
    order: list[str],
    batch: Any,
    g: torch.Generator,
    args: argparse.Namespace,
) -> dict[str, list[float]]:
    """``--block``: each arm in turn runs a block of steps, unaligned; per arm, each round's
    block median (the slowest rank's steps)."""
    rounds = max(1, args.steps // args.block)
    warm = max(1, args.warmup // args.block)
    times: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(warm + rounds):
        k = r % len(order)
        for name in order[k:] + order[:k]:
            steps = []
            for _ in range(args.block):
                x, y = batch(g)
                steps.append(_step(arms[name], opts[name], x, y))
            if r >= warm:
                times[name].extend(steps[BLOCK_WARMUP:])
    per = args.block - BLOCK_WARMUP
    out = {}
    for name, t in times.items():
        slowest = _slowest(t)
        out[name] = [statistics.median(slowest[i : i + per]) for i in range(0, len(slowest), per)]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--model", default="mlp", choices=MODELS)
    p.add_argument("--caps", default="1,4,16", help="DDP bucket sizes, MiB; the first is 1.00")
    p.add_argument("--fusions", default="0,4,16", help="the hook's fusion sizes, MiB")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument(
        "--block",
        type=int,
        default=0,
        help="arms take turns in blocks of this many steps, unaligned",
    )
    p.add_argument("--json", default=None, help="also write every figure here")
    args = p.parse_args(argv)
    args.caps = [float(c) for c in args.caps.split(",")]
    args.fusions = [float(f) for f in args.fusions.split(",") if f]
    out = run_local(_rank, args.world_size, args, timeout_s=1800)[0]
    reference = next(iter(out.values()))
    unit = f"blocks of {args.block} steps" if args.block else "steps"
    print(
        f"{args.model} x{args.world_size}, {args.steps} steps in {unit}; reference "
        f"{next(iter(out))}: {statistics.median(reference) * 1e3:.1f} ms"
    )
    rows: dict[str, Any] = {}
    for name, steps in out.items():
        ratios = [a / b for a, b in zip(steps, reference, strict=True)]
        low, high = median_interval(ratios)
        rows[name] = {"median": statistics.median(ratios), "low": low, "high": high}
        print(f"| {name} | {rows[name]['median']:.3f} ({low:.3f}-{high:.3f}) |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
