"""Rank-side jobs of the reliability tests (tests/test_secrets.py, tests/test_faults_aside.py)."""

from __future__ import annotations

import time

import torch.distributed as dist
from ddp_jobs import Net
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune


def register_with_storage(rank: int, world_size: int, url: str) -> tuple[str, str, list[str]]:
    """Register with storage ``url`` (rank 0 opens it): the error this rank got, and every
    value the ranks left in the rendezvous store while agreeing on setup."""
    message = kind = ""
    try:
        autotune.register(DDP(Net()), autotune.Config(storage=url, timeout_s=60)).close()
    except (RuntimeError, ValueError) as exc:
        kind, message = type(exc).__name__, str(exc)
    # The first state's board (`autotune.faults.FailureBoard`), as it names its keys.
    assert dist.group.WORLD is not None
    board = f"autotune/{dist.group.WORLD.group_name}/0/"
    store = dist.PrefixStore(board, dist.distributed_c10d._get_default_store())
    values = []
    for phase in ("config", "ready"):
        for r in range(world_size):
            key = f"{phase}/{r}"
            if store.check([key]):
                values.append(store.get(key).decode())
    dist.barrier()  # nobody leaves (and takes the store down) before everyone has read
    time.sleep(0.1)
    return kind, message, values
