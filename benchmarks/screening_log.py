"""What the tuner screened, shortlisted and tested, in one first job: its INFO log, rank 0's lines.

    python benchmarks/screening_log.py --world-size 4 --model transformer --steps 450
    python benchmarks/screening_log.py --world-size 4 --sync-every-step
    python benchmarks/screening_log.py --world-size 2 --model mlp --plan 2097152=shm

One of step_gain.py's models trains with autotune on an empty storage (one intra-op thread a
rank, as torchrun sets), and rank 0 prints the tuner's lines about screening (every measured
choice of each class, fastest first), nominations and paired tests. ``--sync-every-step`` adds what
many training loops do after each step (a loss logged, a stop checked; step_gain.py's run 1
does it): a one-element all-reduce on the job's group. Ends with the verdict. Why: to see why a
job did or did not try a choice on the step (docs/BENCHMARKS.md, "What tuning pays").
``--plan`` seeds the storage with a locked plan (size class in bytes = algorithm, comma
separated; the other classes native) as a job before it would have stored it: the job starts
from it, as a restart does, and where the plan needs the hook, the check against plain DDP
(autotune/tuning/plain_check.py) compares it with plain DDP.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from step_gain import MODELS, model_and_batch
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.comm.launch import run_local
from autotune.plan import Choice, Entry, Table, size_class
from autotune.storage import Store, device_model, fingerprint, fingerprint_key

#: The workload the job's plan is stored under (where ``--plan`` seeds it).
WORKLOAD = "screening-log"
#: The tuner's lines worth reading here (rank 0 logs them at INFO).
TOLD = ("screening", "nominated", "duel", "locked", "unhooks", "catch", "kept")


class _Told(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return any(word in record.getMessage() for word in TOLD)


def job(rank: int, world_size: int, args: argparse.Namespace, storage: str) -> str:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)
    if rank == 0:
        handler = logging.StreamHandler(sys.stdout)
        handler.addFilter(_Told())
        handler.setFormatter(logging.Formatter("%(message)s"))
        log = logging.getLogger("autotune")
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    model, batch = model_and_batch(args.model)
    ddp = DDP(model)
    config = autotune.Config(storage=storage, workload=WORKLOAD, timeout_s=120)
    state = autotune.register(ddp, config)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        x, y = batch(g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if args.sync_every_step:
            dist.all_reduce(torch.zeros(1), op=dist.ReduceOp.MIN)
    verdict = state.verdict()
    state.close()
    return verdict


def seed(storage: str, world_size: int, plan: str) -> None:
    """Store ``plan`` ("2097152=shm,...") as the locked plan of this machine's CPU jobs of
    ``world_size`` ranks on one host (gloo, float32), as a job that locked it would have."""
    classes = {}
    for item in plan.split(","):
        nbytes, algorithm = item.split("=")
        classes[size_class(int(nbytes))] = Entry(Choice(algorithm), state="locked")
    fp = fingerprint(
        backend="gloo", world_size=world_size, nodes=1, device=device_model("cpu"), dtype="float32"
    )
    table = Table(classes, 0, fp, None)
    Store(storage, run_id="seed").save_table(fingerprint_key(fp), WORKLOAD, table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--model", choices=MODELS, default="transformer")
    parser.add_argument("--steps", type=int, default=450)
    parser.add_argument("--sync-every-step", action="store_true")
    parser.add_argument("--plan", default="", help="seed the storage: BYTES=ALGORITHM,...")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{Path(tmp) / 'tuning.db'}"
        if args.plan:
            seed(storage, args.world_size, args.plan)
        verdicts: list[Any] = run_local(job, args.world_size, args, storage, threads=1)
    print(verdicts[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
