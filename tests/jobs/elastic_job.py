"""The job of the elastic-restart test, run by ``torchrun --max-restarts 2`` (2 ranks, gloo on
127.0.0.1) with a small tuning budget from ``AUTOTUNE_*`` variables:

- attempt 0: rank 0 crashes hard (``os._exit``, as an OOM kill would) at the first step at which
  it sees a trial running in the storage (or at `EXPLORE_BY`, whatever it sees): the tuner
  explores, and its running trials are left running in the storage. A fixed step would not do:
  this budget screens in a handful of steps, and how many depends on the machine's load;
- attempt 1: tunes on from the studies until its decision is final (the check against plain DDP
  included, where its plan needs the hook: the tuner reads settled through the check, and a crash
  inside it leaves a provisional plan), then rank 0 crashes 10 steps later;
- attempt 2: starts from the stored plan, locked, and trains `STEPS` steps, and on until its
  decision is final (a stored plan that needs the hook meets plain DDP again, in blocks whose
  count a loaded machine may stretch past `STEPS`), at most `CAP`.

Rank 0 writes ``attempt<N>.json`` into the directory given: what the attempt saw.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.testing.settled import everywhere

STEPS = 120
CAP = 600
#: The step by which attempt 0 dies, running trial or not (the test then fails, saying so).
EXPLORE_BY = 60


def report(out: Path, attempt: int, **values: Any) -> None:
    (out / f"attempt{attempt}.json").write_text(json.dumps({"attempt": attempt, **values}))


def running_trials(storage: str) -> int:
    import optuna
    from optuna.trial import TrialState

    total = 0
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        total += len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
    return total


def crash(out: Path, attempt: int, step: int, settled_at: int | None, running: int) -> None:
    report(out, attempt, died_at=step, settled_at=settled_at, running=running)
    sys.stdout.flush()
    os._exit(1)


def main(out: Path) -> None:
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(
            torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
            torch.nn.ReLU(), torch.nn.Linear(256, 4),
        )
    )  # fmt: skip
    state = autotune.register(model)
    assert state.tuner is not None
    storage = state.config.storage
    assert storage is not None
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    settled_at = final_at = None
    for step in range(CAP):
        x = torch.randn(16, 32, generator=g)
        torch.nn.functional.mse_loss(model(x), torch.tanh(x[:, :4])).backward()
        opt.step()
        opt.zero_grad()
        if settled_at is None and state.tuner.settled:
            settled_at = step
        if final_at is None and state.status().final:  # the same step on every rank
            final_at = step
        # Attempt 1 ends only by its crash (an attempt that exits 0 is not restarted).
        if attempt != 1 and step >= STEPS - 1 and everywhere(final_at is not None):
            break
        if rank != 0:
            continue
        if attempt == 0:
            running = running_trials(storage)
            if running or step == EXPLORE_BY:
                crash(out, attempt, step, settled_at, running)
        if attempt == 1 and final_at is not None and step == final_at + 10:
            time.sleep(3)  # the worker has written the locked plan (it writes off the step)
            crash(out, attempt, step, settled_at, running_trials(storage))
    plan = {str(cls): choice.algorithm for cls, choice in state.plan().items()}
    table = state.table()
    state.close()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, h.hexdigest())
    if rank == 0:
        states = sorted({e.state for e in table.classes.values()})
        report(out, attempt, settled_at=settled_at, plan=plan, states=states,
               identical=len(set(digests)) == 1, running=running_trials(storage))  # fmt: skip
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no gloo teardown in the interpreter's exit (it aborts now and then)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
