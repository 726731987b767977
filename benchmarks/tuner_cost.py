"""The live tuner's own cost per iteration, and how many steps it takes to lock in a plan.

    python benchmarks/tuner_cost.py --world-size 4 --steps 300
    python benchmarks/tuner_cost.py --world-size 4 --steps 300 --prior docs/sweeps/sweep-4.json

Trains examples/train_ddp.py's model with ``algorithm="auto"`` from an empty tuning storage (a
temporary SQLite file). The tuner's cost comes in two parts. On the step's path: finishing the
previous exchange and applying the plan it carries, before the iteration's last futures complete.
Beside the next step: learning, deciding and starting the next exchange, after them. Both are
reported against the median step time, while exploring and once everything is locked. Rank 0's
numbers are reported (it also decides, so its cost is the highest); the step counts are the same
on every rank.

With ``--prior SWEEP.json`` the job runs twice, each from an empty storage: without a prior, then
with the cost model's fit to that sweep stored as a sweep with ``--tune`` stores it (the prior
alone, no plan), so only the prior differs. Each run's step to lock, trials and total step time
while exploring are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.comm.launch import run_local
from autotune.util.units import format_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_ddp import Teacher, add_model_arguments, build_model


def _rank(rank: int, world_size: int, args: argparse.Namespace, storage: str) -> dict[str, Any]:
    ddp = DDP(build_model(args.width, args.depth), bucket_cap_mb=args.bucket_cap_mb)
    state = autotune.register(ddp, autotune.Config(storage=storage))
    assert state.tuner is not None
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    teacher = Teacher()
    g = torch.Generator().manual_seed(1000 + rank)
    steps: list[tuple[float, bool]] = []  # (seconds, settled during the step)
    settled_at = None
    for step in range(args.steps):
        x, y = teacher.batch(g, args.batch)
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps.append((time.perf_counter() - start, state.tuner.settled))
        settled_at = (settled_at or step) if state.tuner.settled else None
    state.engine.settle(60)
    iterations = state.recorder.iterations()
    table = state.table()
    off_path = list(state.tuner.off_path_s)
    state.close()
    return {
        "steps": steps,
        "tuner_s": [r.tuner_s for r in iterations],
        "off_path_s": off_path,
        "settled_at": settled_at,
        "table": table,
        "trials": sum(e.trials for e in table.classes.values()),
    }


def _store_prior(storage: str, sweep_path: str, world_size: int) -> str:
    """Store the fit to ``sweep_path`` as the prior of this job's fingerprint; describe it."""
    from autotune.model import Prior
    from autotune.sweep import SweepResult, store_prior

    result = SweepResult.load(sweep_path)
    if result.world_size != world_size or result.backend != "gloo":
        raise SystemExit(f"{sweep_path}: a gloo sweep at {world_size} ranks is needed")
    fitted = store_prior(storage, [result])
    bound = Prior.from_fit(fitted).worst_error
    return f"prior: fit to {sweep_path}, worst error {bound:.0%} (without native)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--prior", metavar="SWEEP_JSON", help="also run with the model's fit as prior")
    add_model_arguments(p)
    args = p.parse_args(argv)
    _run(args, None)
    if args.prior:
        print()
        _run(args, args.prior)
    return 0


def _run(args: argparse.Namespace, prior: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{Path(tmp) / 'tuning.db'}"
        how = "empty storage"
        if prior is not None:
            how = "empty storage but a " + _store_prior(storage, prior, args.world_size)
        r = run_local(_rank, args.world_size, args, storage, timeout_s=3600)[0]
    steps, tuner_s = r["steps"], r["tuner_s"]
    print(f"{args.world_size} ranks, {args.steps} steps, {how}")
    explored = [t for t, settled in steps if not settled]
    print(f"step time while exploring: {sum(explored):.2f} s over {len(explored)} steps")
    if r["settled_at"] is None:
        print("not settled by the end: run more steps")
    else:
        print(
            f"everything locked from step {r['settled_at']}; trials run: {r['trials']} (+ fusion)"
        )
    for label, settled in (("exploring", False), ("locked", True)):
        idx = [i for i, (_, s) in enumerate(steps) if s == settled and i < len(tuner_s)]
        if not idx:
            continue
        step_med = statistics.median(steps[i][0] for i in idx)
        cost = [tuner_s[i] for i in idx]
        off = [r["off_path_s"][i] for i in idx if i < len(r["off_path_s"])]
        med, mean = statistics.median(cost), statistics.fmean(cost)
        print(
            f"{label:>9}: {len(idx)} steps, step median {step_med * 1e3:.1f} ms; tuner per "
            f"iteration, on the step's path: median {med * 1e6:.0f} us ({med / step_med:.2%}), "
            f"mean {mean * 1e6:.0f} us ({mean / step_med:.2%}); beside the next step: median "
            f"{statistics.median(off) * 1e6:.0f} us, mean {statistics.fmean(off) * 1e6:.0f} us"
        )
    table = r["table"]
    fusion = format_bytes(table.fusion_bytes) if table.fusion_bytes else "DDP's buckets"
    print(f"plan: fusion {fusion}")
    for cls, e in sorted(table.classes.items()):
        seg = format_bytes(e.choice.segment_bytes) if e.choice.segment_bytes else "default"
        best = f"{e.best_s * 1e3:.2f} ms" if e.best_s else "-"
        print(
            f"  {format_bytes(cls):>8}: {e.choice.algorithm} ({seg}) {e.state}, {e.trials} "
            f"trials, best {best}"
        )


if __name__ == "__main__":
    sys.exit(main())
