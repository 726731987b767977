"""The shared transport and algorithm entry: hazards, failed peers, mismatched calls, subgroups."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from autotune.algorithms import (
    PeerError,
    Recv,
    Send,
    Transport,
    get_algorithm,
    p2p_group,
)
from autotune.comm.groups import Comm
from autotune.comm.launch import launch, run_local

pytestmark = pytest.mark.distributed


def _comm() -> Comm:
    group = p2p_group()
    return Comm(group, dist.get_rank(group), dist.get_world_size(group), "gloo", "test", None)


def _swap(rank: int, world_size: int, numel: int, rounds: int) -> list[float]:
    # Send a range and receive into the same range in the same round (an in-place exchange):
    # the receive must not land while the send still reads the range.
    comm = _comm()
    peer = 1 - rank
    buf = torch.full((numel,), float(rank))
    plan = [([Send(peer, 0, numel)], [Recv(peer, 0, numel, reduce=False)]) for _ in range(rounds)]
    Transport(buf, comm).run(plan)
    return sorted(set(buf.tolist()))


def test_in_place_exchange_never_reads_what_it_overwrites() -> None:
    # Odd number of swaps: each rank must end with exactly the peer's original value everywhere.
    got = run_local(_swap, 2, 1 << 18, 5)
    assert got == [[1.0], [0.0]]


def _reduce_twice(rank: int, world_size: int) -> list[float]:
    # Two receives into the same range in flight at once apply in posting order, both counted.
    comm = _comm()
    buf = torch.full((1000,), float(rank + 1))
    peer = 1 - rank
    plan = [
        ([Send(peer, 0, 1000)], [Recv(peer, 0, 1000)]),  # buf = mine + peer's
        ([Send(peer, 0, 1000)], [Recv(peer, 0, 1000)]),  # buf = 2 * (mine + peer's)
    ]
    Transport(buf, comm).run(plan)
    return sorted(set(buf.tolist()))


def test_reductions_apply_in_round_order() -> None:
    assert run_local(_reduce_twice, 2) == [[6.0], [6.0]]


def _stall(rank: int, world_size: int, behaviour: str) -> float:
    algo = get_algorithm("ring", timeout_s=2)
    x = torch.ones(1 << 16)
    if behaviour != "never":
        algo.all_reduce(x)  # one good call first: the dedicated group exists
    if rank == 1:
        if behaviour == "exit":
            os._exit(3)  # dies without a word
        time.sleep(8)  # alive, but never joins the next all-reduce
        return 0.0
    start = time.monotonic()
    try:
        algo.all_reduce(x)
    except PeerError as exc:
        elapsed = time.monotonic() - start
        assert "ring all-reduce" in str(exc)
        if behaviour == "never":
            assert "setting up the point-to-point group over ranks [0, 1]" in str(exc)
        else:
            assert "from rank 1" in str(exc) or "to rank 1" in str(exc)
        if behaviour != "exit":
            assert "0:00:02" in str(exc)
        return elapsed
    raise AssertionError("all_reduce returned although its peer never took part")


@pytest.mark.parametrize("behaviour", ["stall", "exit", "never"])
def test_failed_peer_raises_naming_it_within_the_timeout(behaviour: str) -> None:
    results = launch(_stall, 2, behaviour, timeout_s=60)
    assert results[0].ok, results[0].error
    assert results[0].value < 6.0  # timeout_s=2; never the process group's 60 s


def _mismatch(rank: int, world_size: int, what: str) -> str:
    numel = 10 + (2 * rank if what == "numel" else 0)
    seg = 64 * (1 + rank) if what == "segment" else 64
    try:
        get_algorithm("ring", timeout_s=10).all_reduce(torch.ones(numel), segment_bytes=seg)
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("what", ["numel", "segment"])
def test_debug_detail_catches_mismatched_calls(what: str) -> None:
    # gloo takes a short message into a long receive without complaint, so without this check
    # the sum would be silently wrong; TORCH_DISTRIBUTED_DEBUG=DETAIL turns the check on.
    messages = run_local(_mismatch, 2, what, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for msg in messages:
        assert "different arguments on different ranks" in msg
        assert ("numel=10" if what == "numel" else "segment_bytes=64") in msg


def _subgroup(rank: int, world_size: int) -> list[float] | None:
    # Ranks 0 and 2 reduce among themselves; rank 1 never calls in, not even to make the group's
    # dedicated twin, and does something else on the world meanwhile.
    sub = dist.new_group([0, 2])
    x = torch.full((5,), float(rank + 1))
    if rank == 1:
        return None
    get_algorithm("two_tree", timeout_s=20).all_reduce(x, sub)
    return x.tolist()


def test_all_reduce_over_a_subgroup() -> None:
    assert run_local(_subgroup, 3) == [[4.0] * 5, None, [4.0] * 5]


def _not_member(rank: int, world_size: int) -> str:
    sub = dist.new_group([0])
    if rank == 0:
        return "member"
    try:
        get_algorithm("ring").all_reduce(torch.ones(3), sub)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_non_member_is_told() -> None:
    assert "not a member" in run_local(_not_member, 2)[1]


def _dedicated(rank: int, world_size: int) -> bool:
    a = p2p_group()
    same = a is p2p_group() and a is not dist.group.WORLD and p2p_group(a) is a
    # gloo connects a new group's pairs from each side: a rank that returned, and tore its
    # groups down, before its peer had connected failed that peer ("Connection closed by
    # peer", once in a loaded suite). Autotune sends on the group at once; here, a barrier.
    dist.barrier(group=a)
    return same


def test_p2p_traffic_gets_its_own_group() -> None:
    assert run_local(_dedicated, 2) == [True, True]
