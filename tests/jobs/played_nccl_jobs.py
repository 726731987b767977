"""Ranks on the played NCCL (autotune.testing.played_nccl): its own rules, one per job."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from ddp_jobs import until_gone

from autotune.testing import played_nccl


def one_work_per_batch(rank: int, world_size: int) -> dict[str, Any]:
    peer = 1 - rank
    mine = [torch.full((3,), float(rank)), torch.full((5,), 10.0 + rank)]
    got = [torch.empty(3), torch.empty(5)]
    ops = [dist.P2POp(dist.irecv, t, peer) for t in got]
    ops += [dist.P2POp(dist.isend, t, peer) for t in mine]
    works = dist.batch_isend_irecv(ops)
    for _ in ops:  # the one Work stands for each operation: waiting it again is at once
        works[0].wait(timedelta(seconds=30))
    played_nccl.final_check()
    [launch] = played_nccl.launches()
    return {
        "works": len(works),
        "got": [t.tolist() for t in got],
        "launch": (launch.op, launch.sends, launch.recvs),
    }


def timed_wait_times_out(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 1 comes to the all-reduce 3 s late; rank 0 waits for it with a 0.5 s timeout, then
    waits again and launches again; rank 1 waits with a 2 s timeout: what each saw."""
    if rank == 1:
        time.sleep(3.0)
    work = dist.all_reduce(torch.ones(4), async_op=True)
    assert work is not None
    seen: dict[str, Any] = {}
    try:
        work.wait(timedelta(seconds=0.5) if rank == 0 else timedelta(seconds=2))
    except RuntimeError as exc:
        kind = "DistBackendError" if isinstance(exc, dist.DistBackendError) else "other"
        seen["said"], seen["pending"] = f"{kind}: {exc}", not work.is_completed()
    if rank == 0:
        relaunch = lambda: dist.all_reduce(torch.ones(1))  # noqa: E731
        for what, again in (("again", work.wait), ("launch", relaunch)):
            try:
                again()
            except RuntimeError as exc:
                seen[what] = str(exc)
        seen["ends_at"] = played_nccl.ends_at()
    return seen


def crossed_communicators(rank: int, world_size: int) -> None:
    """Rank 0 launches on A then B, rank 1 on B then A: on NCCL a hang."""
    config = dist.get_backend_config()
    a = dist.new_group(backend=config)
    b = dist.new_group(backend=config)
    order = [a, b] if rank == 0 else [b, a]
    works = [dist.all_reduce(torch.ones(2), group=g, async_op=True) for g in order]
    for w in works:
        assert w is not None
        w.wait()
    played_nccl.final_check()


def a_pair_and_a_bystander(rank: int, world_size: int) -> list[tuple[str, int]]:
    """Ranks 0 and 1 swap a tensor on the world's communicator, rank 2 does not; then all
    three all-reduce. Rank 2's launches differ from theirs, and rightly pass: the swap does
    not concern it."""
    if rank < 2:
        peer = 1 - rank
        got = torch.empty(2)
        ops = [dist.P2POp(dist.irecv, got, peer), dist.P2POp(dist.isend, torch.ones(2), peer)]
        dist.batch_isend_irecv(ops)[0].wait()
    dist.all_reduce(torch.ones(2))
    played_nccl.final_check()
    return [(launch.op, len(launch.sends)) for launch in played_nccl.launches()]


def waits_on_a_dead_peers_future(rank: int, world_size: int) -> float | None:
    """Rank 1 leaves; rank 0 all-reduces and waits on the work's future: when the watchdog ends
    it, as rank 0 saw it the moment its wait raised (None: it did not know yet)."""
    # First one all-reduce both take part in: a rank 1 that left the moment its own side of the
    # group was up could close gloo's connections while rank 0 was still making them.
    dist.all_reduce(torch.zeros(1))
    if rank == 1:
        os._exit(0)
    work = dist.all_reduce(torch.ones(4), async_op=True)
    assert work is not None
    try:
        work.get_future().wait()
    except RuntimeError:
        return played_nccl.ends_at()
    raise AssertionError("an all-reduce with a rank gone completed")


def sends_to_a_peer_gone(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 1 leaves; once its process is gone and gloo has seen its connection close, rank 0
    sends to it: whether the launch raised, what the wait raised, and when the watchdog ends
    rank 0 (None: it did not know)."""
    store = dist.distributed_c10d._get_default_store()
    dist.all_reduce(torch.zeros(1))  # every connection is up
    if rank == 1:
        store.set("pid", str(os.getpid()))
        os._exit(0)
    until_gone(int(store.get("pid")))
    try:
        work = dist.isend(torch.ones(4), 1)
    except RuntimeError as exc:
        return {"launch raised": repr(exc), "wait raised": None, "ends_at": played_nccl.ends_at()}
    assert work is not None
    try:
        work.wait()
    except RuntimeError as exc:
        return {"launch raised": None, "wait raised": repr(exc), "ends_at": played_nccl.ends_at()}
    raise AssertionError("a send to a rank gone completed")
