"""What a job pays once autotune has unhooked: its step against plain DDP's, in one run.

    python benchmarks/unhook_cost.py --world-size 4 --steps 300

Once autotune unhooks, DDP runs without the hook, on a gloo group of autotune's (whose
timeout is ``Config.timeout_s``), with autotune's fault contract around it: a forward pre-hook,
``backward()`` through one wrapper, a heartbeat thread a rank. Each rank builds two identical
models of examples/train_ddp.py: plain DDP, and DDP registered with autotune on a plan file that
keeps DDP's own all-reduce (it unhooks after the first iteration, as a job whose tuner kept
the baseline does). They take turns step by step on the same batches; a step is forward,
backward and the optimizer, and the slowest rank's time counts. Reported: the median and
interquartile range of the per-step ratio autotune/plain, after ``--warmup`` steps.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.comm.launch import run_local
from autotune.ddp.stats import quartiles
from autotune.plan import Buckets, Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_ddp import Teacher, add_model_arguments, build_model


def _job(rank: int, world_size: int, args: argparse.Namespace, plan: str) -> dict[str, Any]:
    base = build_model(args.width, args.depth)
    cap = args.bucket_cap_mb
    plain = DDP(copy.deepcopy(base), bucket_cap_mb=cap)
    ours = DDP(copy.deepcopy(base), bucket_cap_mb=cap)
    state = autotune.register(ours, autotune.Config(plan_file=plan))
    models = {"plain": plain, "unhooked": ours}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in models.items()}
    teacher, g = Teacher(), torch.Generator().manual_seed(rank)
    times: dict[str, list[float]] = {k: [] for k in models}
    for step in range(args.steps):
        x, y = teacher.batch(g, args.batch)
        order = list(models) if step % 2 else list(reversed(models))  # neither always first
        for k in order:
            dist.barrier()
            begin = time.perf_counter()
            torch.nn.functional.cross_entropy(models[k](x), y).backward()
            opts[k].step()
            opts[k].zero_grad()
            times[k].append(time.perf_counter() - begin)
    slowest = {}
    for k, t in times.items():
        mine = torch.tensor(t, dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        slowest[k] = mine.tolist()
    aside_at = None if state.unhooking is None else state.unhooking.at
    group = ours.process_group.group_desc
    state.close()
    return {"times": slowest, "aside_at": aside_at, "ddp_group": group}


def _median_interval(values: list[float], rounds: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median (resampled with a fixed seed)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--json", help="write the per-step times here")
    add_model_arguments(p)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        plan.write_text(json.dumps(Table({}, 0, buckets=Buckets(1 << 20, None)).to_json()))
        result = run_local(_job, args.world_size, args, str(plan), timeout_s=3600)[0]
    times = result["times"]
    pairs = list(zip(times["unhooked"], times["plain"], strict=True))[args.warmup :]
    ratios = [a / b for a, b in pairs if b > 0]
    q1, median, q3 = quartiles(ratios)
    low, high = _median_interval(ratios)
    plain_ms = statistics.median(times["plain"][args.warmup :]) * 1e3
    print(
        f"world {args.world_size}, mlp {args.width}x{args.depth}, batch {args.batch}: "
        f"unhooked after iteration {result['aside_at']} (DDP on {result['ddp_group']}); "
        f"step autotune/plain DDP median {median:.3f} (95% interval {low:.3f}-{high:.3f}, "
        f"IQR {q1:.3f}-{q3:.3f}) over {len(ratios)} paired steps; plain DDP's step "
        f"{plain_ms:.2f} ms"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "args": vars(args)}))


if __name__ == "__main__":
    main()
