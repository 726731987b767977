"""What the sweep tests run on spawned ranks."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from broken_algorithms import LosesLastElement

from autotune.algorithms import AllReduceAlgorithm, Comm, PeerError, RingAllReduce, register
from autotune.sweep import SweepOptions, run_sweep
from autotune.sweep._measure import Bench, Variant


def sweep(
    rank: int, world_size: int, options: dict[str, Any], json_path: str | None, broken: bool = True
) -> Any:
    """`run_sweep` as `autotune sweep` runs it; with ``broken``, a broken algorithm registered
    (which the sweep then runs too, where ``options`` name no algorithms)."""
    if broken:
        register(LosesLastElement.name, LosesLastElement, replace=True)
    return run_sweep(SweepOptions(**options), command="test", json_path=json_path).to_json()


class DiesOnRankOne(AllReduceAlgorithm):
    """Rank 1 exits in its first call, once every rank has called (each says so with a file in
    `folder`): all are past setting up the algorithm's group, which a death there would fail
    first. The others return at once and go on to the barrier."""

    name = "dies_on_rank_one"
    segmented = False
    folder = ""

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        Path(self.folder, str(comm.rank)).touch()
        if comm.rank == 1:
            deadline = time.monotonic() + 60
            while len(list(Path(self.folder).iterdir())) < comm.size:
                assert time.monotonic() < deadline, "the other ranks never called"
                time.sleep(0.01)
            os._exit(17)


def sweep_with_a_dying_rank(
    rank: int, world_size: int, options: dict[str, Any], folder: str
) -> str:
    """The survivors' error when rank 1 dies mid-sweep (``folder``: empty, for `DiesOnRankOne`)."""
    DiesOnRankOne.folder = folder
    register(DiesOnRankOne.name, DiesOnRankOne, replace=True)
    try:
        run_sweep(SweepOptions(**options), command="test")
    except PeerError as exc:
        return str(exc)
    raise AssertionError("the sweep went on without rank 1")


#: The segment of each `RecordsOrder` call, in order.
CALLS: list[int] = []


class RecordsOrder(RingAllReduce):
    """The ring, noting the segment of each call: variants told apart by their segment."""

    name = "records_order"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        CALLS.append(segment_elems * buf.element_size())
        super()._run(buf, comm, segment_elems)


def measured_order(rank: int, world_size: int, rounds: int) -> tuple[list[int], int]:
    """The segments of the calls `Bench.measure` made, in order, and how many rounds it timed."""
    register(RecordsOrder.name, RecordsOrder, replace=True)
    group = torch.distributed.group.WORLD
    assert group is not None
    bench = Bench(group, torch.device("cpu"), torch.float32, 60)
    variants = [Variant(f"v{k}", RecordsOrder.name, (k + 1) * 1024) for k in range(4)]
    measured = bench.measure(1 << 14, variants, iters=rounds - 1, warmup=1, check=0)
    return CALLS, len(measured.seconds)
