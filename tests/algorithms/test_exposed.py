"""`shm` summing each rank's input where it is (`autotune.algorithms._exposed`): the input's
memory moved into shared memory once, views and all, the peers reading it there; bitwise the
sums of the copying path; each rank falling back to its slot on its own; ranks that cannot open
each other's memory never trying; a freed input's mapping let go.
(tests/ddp/test_hook.py trains DDP through it under DDP's options.)"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from autotune.algorithms import _exposed, get_algorithm, p2p_group
from autotune.algorithms import _shared_memory as shm
from autotune.algorithms._pipes import PipeBarrier
from autotune.comm.groups import Comm
from autotune.comm.launch import run_local

pytestmark = pytest.mark.distributed

WITHIN = 1 << 16  # what the caller sums in an iteration: the sums are left in the window


def _window(world_size: int) -> shm._Window:
    group = p2p_group()
    return shm._window(Comm(group, dist.get_rank(group), world_size, "gloo", "shm", None))


def _records(rank: int, world_size: int) -> dict[str, object]:
    group = p2p_group()
    comm = Comm(group, dist.get_rank(group), world_size, "gloo", "shm", timedelta(seconds=60))
    barrier = PipeBarrier.open(comm, f"{shm.SHM_DIR}/autotune-test-records-{os.getppid()}")
    out: dict[str, object] = {}
    try:
        # Three barriers in a row: each peer's record of each, in order, even where a peer has
        # written its next one before this rank read the last.
        got = [barrier.exchange(comm, "a test", bytes([rank, k]) * 20) for k in range(3)]
        out["records"] = [sorted((p, r[:2]) for p, r in g.items()) for g in got]
        barrier.wait(comm, "a byte between")
        try:
            barrier.exchange(comm, "a test", b"")
        except ValueError as exc:
            out["empty"] = str(exc)
    finally:
        barrier.close()
    return out


def test_a_barrier_carries_each_ranks_record_to_every_peer() -> None:
    for rank, got in enumerate(run_local(_records, 3)):
        peers = [p for p in range(3) if p != rank]
        assert got["records"] == [[(p, bytes([p, k])) for p in peers] for k in range(3)]
        assert "a barrier's record is 1 to 4096 bytes: 0" in str(got["empty"])


def _reference(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """The sum as the copying path gives it: each input scaled first, into the input."""
    first = x.clone().mul_(1.0 / world_size)
    get_algorithm("shm").all_reduce(first)
    return first


def _in_place(rank: int, world_size: int, refuse: int | None) -> dict[str, object]:
    if rank == refuse:  # this rank's /dev/shm never has room enough for its inputs
        _exposed.ROOM_FACTOR = 1 << 40
    algo = get_algorithm("shm")
    group = p2p_group()
    g = torch.Generator().manual_seed(rank)
    inputs = [torch.randn(n, generator=g) for n in (1000, 3001, 20_000)]
    view = inputs[0][5:10]  # a view taken before the memory moves
    out: dict[str, object] = {}
    for round_ in range(2):
        for i, x in enumerate(inputs):
            x.normal_(generator=g)
            pending = algo.start(x, group, scale=1.0 / world_size, leave_within=WITHIN)
            assert pending.traffic is not None and pending.traffic.result is not None
            out[f"bitwise {round_} {i}"] = torch.equal(
                pending.traffic.result, _reference(x, world_size)
            )
    window = _window(world_size)
    assert window.exposed is not None
    out["moved"] = [x.is_shared() for x in inputs]
    inputs[0][7] = 42.0
    out["view follows"] = view.data_ptr() == inputs[0].data_ptr() + 20 and float(view[2]) == 42.0
    out["mapped"] = window.exposed.mapped()
    # Where the scale is not a power of two, or float16 (often subnormal), each is scaled
    # first, as its copy into the slot does: the input stays where it was.
    for name, dtype, scale in [("third", torch.float32, 1 / 3), ("fp16", torch.float16, 0.25)]:
        x = torch.randn(500, generator=g).to(dtype)
        pending = algo.start(x, group, scale=scale, leave_within=WITHIN)
        assert pending.traffic is not None and pending.traffic.result is not None
        first = x.clone().mul_(scale)
        algo.all_reduce(first)
        out[f"{name}: bitwise, not moved"] = (
            torch.equal(pending.traffic.result, first) and not x.is_shared()
        )
    x = torch.randn(700, generator=g).bfloat16()  # bf16's range is float32's: summed in place
    pending = algo.start(x, group, scale=0.25 if world_size == 4 else None, leave_within=WITHIN)
    assert pending.traffic is not None and pending.traffic.result is not None
    out["bf16 moved"] = x.is_shared()
    return out


@pytest.mark.parametrize("refuse", [None, 2], ids=["every rank", "rank 2 copies"])
def test_peers_sum_each_ranks_input_where_it_is(refuse: int | None) -> None:
    got = run_local(_in_place, 4, refuse)
    for rank, out in enumerate(got):
        assert all(v is True for k, v in out.items() if k.startswith("bitwise")), out
        assert out["moved"] == [rank != refuse] * 3
        assert out["view follows"] is True
        # Each peer's three inputs mapped once, over two rounds (none of the one that copies).
        assert out["mapped"] == 3 * (3 if refuse is None or rank == refuse else 2)
        assert out["third: bitwise, not moved"] is True
        assert out["fp16: bitwise, not moved"] is True
        assert out["bf16 moved"] is (rank != refuse)


def _freed(rank: int, world_size: int) -> list[int]:
    _exposed.IDLE_MESSAGES = 2
    algo = get_algorithm("shm")
    group = p2p_group()
    mapped = []
    for n in (1000, 1000, 1000, 2000):  # a new input each time: the last one freed
        x = torch.full((n,), float(rank))
        pending = algo.start(x, group, leave_within=WITHIN)
        assert pending.traffic is not None and pending.traffic.result is not None
        assert torch.equal(pending.traffic.result, torch.full((n,), 6.0))  # 0 + 1 + 2 + 3
        window = _window(world_size)
        assert window.exposed is not None
        mapped.append(window.exposed.mapped())
        del x, pending
    return mapped


def test_a_peers_input_not_read_for_a_while_is_unmapped() -> None:
    # After each message, what is mapped: three peers' inputs each time, those not read in the
    # last two messages let go (a freed input's memory stays in /dev/shm while a peer maps it).
    assert run_local(_freed, 4) == [[3, 6, 6, 6]] * 4


def _other_namespace(rank: int, world_size: int) -> dict[str, bool]:
    if rank == 1:  # as if in a PID namespace of its own: its pid means another process here
        _exposed.os.getpid = lambda: 1  # type: ignore[attr-defined]
    x = torch.full((1000,), float(rank))
    pending = get_algorithm("shm").start(x, p2p_group(), leave_within=WITHIN)
    assert pending.traffic is not None and pending.traffic.result is not None
    return {
        "exact": torch.equal(pending.traffic.result, torch.full((1000,), 3.0)),
        "never tried": _window(world_size).exposed is None and not x.is_shared(),
    }


def test_ranks_that_cannot_open_each_others_memory_copy_into_their_slots() -> None:
    assert run_local(_other_namespace, 3) == [{"exact": True, "never tried": True}] * 3


def _fused(rank: int, world_size: int, refuse: int | None, parts: int) -> dict[str, object]:
    if rank == refuse:
        _exposed.ROOM_FACTOR = 1 << 40
    algo = get_algorithm("shm")
    group = p2p_group()
    g = torch.Generator().manual_seed(rank)
    sizes = [(97 * k) % 1000 + 1 for k in range(1, parts + 1)]  # uneven: shares cross parts
    inputs = [torch.randn(n, generator=g) for n in sizes]
    total = sum(sizes)
    out: dict[str, object] = {}
    for round_ in range(2):
        for x in inputs:
            x.normal_(generator=g)
        # As the engine sends a fused message (`autotune.ddp.messages.stage`): the slot, the
        # parts gathered into it (or left where they are), then the sum left in the window.
        slot = algo.stage(group, 4 * total, torch.float32, leave_within=4 * total)
        assert slot is not None
        algo.gather(group, inputs, slot, 1.0 / world_size)
        pending = algo.start(slot, group, leave_within=4 * total)
        assert pending.traffic is not None and pending.traffic.result is not None
        expected = _reference(torch.cat(inputs), world_size)
        out[f"bitwise {round_}"] = torch.equal(pending.traffic.result, expected)
    out["moved"] = all(x.is_shared() for x in inputs)
    return out


@pytest.mark.parametrize(
    ("refuse", "parts"), [(None, 5), (2, 5), (None, _exposed.MAX_PARTS + 1)],
    ids=["every rank", "rank 2 gathers", "too many parts"],
)  # fmt: skip
def test_a_fused_message_is_summed_from_its_parts_where_they_are(
    refuse: int | None, parts: int
) -> None:
    in_place = parts <= _exposed.MAX_PARTS
    for rank, out in enumerate(run_local(_fused, 4, refuse, parts)):
        assert out["bitwise 0"] is True and out["bitwise 1"] is True, out
        assert out["moved"] is (in_place and rank != refuse)
