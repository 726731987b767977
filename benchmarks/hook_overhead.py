"""Step time of the example job with autotune's hook against DDP without it, in one run.

    python benchmarks/hook_overhead.py --world-size 4 --steps 60

Each rank builds identical models from examples/train_ddp.py: plain DDP, DDP with PyTorch's own
``allreduce_hook`` (the floor for any hook written in Python: a 1/N pass, then the backend's
all-reduce), DDP with the hook in fixed `native` mode, and DDP with the hook in `auto` mode (the
tuner on, from an empty storage: it explores for the first hundred steps or so, then runs what it
locked in). They take turns
step by step on the same batches, so drift on a shared machine hits them alike. A step is
forward, backward (which waits for the all-reduces) and the optimizer, timed on each rank; the
slowest rank's time counts. Reported:
the median and interquartile range of the per-step ratio hooked/plain, and the hook's own cost
per bucket (its call to its return, on the autograd thread) in each mode.
"""

from __future__ import annotations

import argparse
import bisect
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.comm.launch import run_local
from autotune.ddp.stats import MessageRecord, quartiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_ddp import Teacher, add_model_arguments, build_model

MODES = ("plain", "allreduce_hook", "native", "auto")  # and any registered algorithm


def _rank(rank: int, world_size: int, args: argparse.Namespace, storage: str) -> dict[str, Any]:
    modes = args.modes
    base = build_model(args.width, args.depth)
    models: dict[str, DDP] = {}
    states: dict[str, autotune.AutotuneState] = {}
    for mode in modes:
        models[mode] = DDP(copy.deepcopy(base), bucket_cap_mb=args.bucket_cap_mb)
        if mode == "allreduce_hook":
            models[mode].register_comm_hook(dist.group.WORLD, allreduce_hook)
        elif mode != "plain":
            config = autotune.Config(algorithm=mode, storage=storage)
            states[mode] = autotune.register(models[mode], config)
    optimizers = {m: torch.optim.SGD(models[m].parameters(), lr=0.1) for m in modes}
    teacher = Teacher()
    g = torch.Generator().manual_seed(1000 + rank)
    times = torch.zeros(args.steps, len(modes), dtype=torch.float64)
    compute = torch.zeros(args.steps, len(modes), dtype=torch.float64)  # until the last bucket
    buckets = {m: 0 for m in states}
    for step in range(args.warmup + args.steps):
        x, y = teacher.batch(g, args.batch)
        for j, mode in enumerate(modes):
            dist.barrier()
            start = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(models[mode](x), y)
            loss.backward()
            optimizers[mode].step()
            optimizers[mode].zero_grad(set_to_none=True)
            if step >= args.warmup:
                times[step - args.warmup, j] = time.perf_counter() - start
                if mode in states:
                    last_call = states[mode].recorder.hook_calls()[-1][0]
                    compute[step - args.warmup, j] = last_call - start
        if step == args.warmup - 1:
            buckets = {m: len(s.recorder.hook_calls()) for m, s in states.items()}
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.all_reduce(compute, op=dist.ReduceOp.MAX)
    hook_us: dict[str, list[float]] = {}
    wait_ms: dict[str, float] = {}
    run_ms: dict[str, float] = {}
    for mode, state in states.items():
        state.stats()  # waits until every message is recorded
        calls = state.recorder.hook_calls()[buckets[mode] :]
        hook_us[mode] = [seconds * 1e6 for _, seconds in calls]
        records = [r for r in state.recorder.records() if r.iteration >= args.warmup]
        wait_ms[mode] = _message_waits(calls, records) * 1e3
        run_ms[mode] = statistics.median(r.seconds for r in records) * 1e3
    for state in states.values():
        state.close()
    return {
        "times": times.tolist(),
        "compute": compute.tolist(),
        "hook_us": hook_us,
        "wait_ms": wait_ms,
        "run_ms": run_ms,
        "buckets_per_step": {m: len(h) / args.steps for m, h in hook_us.items()},
    }


def _message_waits(calls: list[tuple[float, float]], records: list[MessageRecord]) -> float:
    """Median seconds from a bucket's hook call until its message started, over the timed
    steps (``calls`` are theirs); a message of several fused buckets counts from the last one's."""
    starts = [t for t, _ in calls]
    waits = []
    for record in records:
        i = bisect.bisect_right(starts, record.started)
        if i > 0:
            waits.append(record.started - starts[i - 1])
    return statistics.median(waits) if waits else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    add_model_arguments(p)
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"which of {','.join(MODES)} (plain is required, first)",
    )
    args = p.parse_args(argv)
    args.modes = args.modes.split(",")
    allowed = set(MODES) | set(autotune.algorithms.available())
    if args.modes[0] != "plain" or not set(args.modes) <= allowed:
        p.error(f"--modes: plain first, then any of {', '.join(sorted(allowed - {'plain'}))}")
    with tempfile.TemporaryDirectory() as tmp:  # auto tunes from scratch, not from the cache
        storage = f"sqlite:///{Path(tmp) / 'tuning.db'}"
        result = run_local(_rank, args.world_size, args, storage, timeout_s=3600)[0]
    times = result["times"]
    plain = [row[0] for row in times]
    print(f"{args.world_size} ranks, {args.steps} steps")
    print(f"plain DDP step: median {statistics.median(plain) * 1e3:.1f} ms")
    for j, mode in enumerate(args.modes[1:], start=1):
        ratios = [row[j] / row[0] for row in times]
        q1, q2, q3 = quartiles(ratios)
        med = statistics.median(row[j] for row in times) * 1e3
        print(
            f"hook, {mode:>14}: step median {med:.1f} ms; step time / plain DDP: "
            f"median {q2:.3f}x (IQR {q1:.3f}-{q3:.3f})"
        )
    for j, mode in enumerate(args.modes):
        if mode not in result["hook_us"]:
            continue
        compute = [row[j] for row in result["compute"]]
        tail = [row[j] - c for row, c in zip(times, compute, strict=True)]
        h1, h2, h3 = quartiles(result["hook_us"][mode])
        print(
            f"hook, {mode:>14}: {result['buckets_per_step'][mode]:.1f} buckets/step; compute "
            f"{statistics.median(compute) * 1e3:.2f} ms, tail {statistics.median(tail) * 1e3:.2f}"
            f" ms; hook call median {h2:.0f} us (IQR {h1:.0f}-{h3:.0f}); a message waits "
            f"{result['wait_ms'][mode]:.2f} ms from its hook call to its start, then runs "
            f"{result['run_ms'][mode]:.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
