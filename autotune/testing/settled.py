"""When a test's ranks may stop training: every rank's tuner has settled on its plan."""

from __future__ import annotations

import torch
import torch.distributed as dist

from autotune.algorithms import bookkeeping_device
from autotune.comm_hook import AutotuneState

__all__ = ["all_settled", "control_device", "everywhere"]


def all_settled(state: AutotuneState, on_baseline: bool = False) -> bool:
    """Whether every rank has settled (`AutotuneState.settled`: the tuner's plan, and DDP's
    bucket size where autotune unhooked; ranks learn it at different steps, and this
    agrees, collectively over the state's group), and with ``on_baseline``, on the baseline
    (which rank 0, the one deciding, knows)."""
    tuner = state.tuner
    assert tuner is not None, "the state has no tuner (algorithm='auto' without a plan file)"
    done = state.settled
    if on_baseline and tuner.decider is not None:
        done = done and tuner.decider.plan_search.baseline_kept
    return everywhere(done, state.process_group)


def everywhere(done: bool, group: dist.ProcessGroup | None = None) -> bool:
    """Whether ``done`` holds on every rank of ``group`` (a MIN all-reduce: call it on all)."""
    flag = torch.tensor([1 if done else 0], device=control_device(group))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def control_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a job's own small all-reduces over ``group`` (default: the world) travel: the CPU
    where the group has a CPU backend (gloo), else the current CUDA device (NCCL)."""
    group = group or dist.group.WORLD
    assert group is not None, "no process group"
    # Asked with the bare "cuda" first, which starts nothing on a GPU: a CPU job there would
    # otherwise open a CUDA context in every rank.
    if bookkeeping_device(group, torch.device("cuda")).type == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())
