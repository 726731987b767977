"""The shared-memory all-reduce beyond the conformance suite: messages larger than its window,
where it is offered and where not, a full /dev/shm, its barrier through pipes, a peer that
never comes or is gone, nothing left behind.
(tests/algorithms/test_conformance.py checks its sums at N = 1..8, every dtype and size.)"""

from __future__ import annotations

import itertools
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from autotune.algorithms import PeerError, get_algorithm, p2p_group
from autotune.algorithms import _shared_memory as shm
from autotune.algorithms._pipes import PipeBarrier
from autotune.comm.groups import Comm
from autotune.comm.launch import launch, run_local
from autotune.comm.topology import NODE_ID_ENV

pytestmark = pytest.mark.distributed


def _many_turns(rank: int, world_size: int, dtype: torch.dtype) -> tuple[list[float], int, bool]:
    shm.MAX_WINDOW_BYTES = shm.MIN_WINDOW_BYTES  # a slot of 256 KiB
    size = torch.tensor([], dtype=dtype).element_size()
    numel = 3 * shm.MIN_WINDOW_BYTES // size + 5  # three full turns and 5 elements more
    # Integers the sum holds exactly in fp16 too (below 2048).
    buf = (torch.arange(numel) % 500 + rank * 100).to(dtype)
    group = p2p_group()
    comm = Comm(group, dist.get_rank(group), world_size, "gloo", "shm", None)
    algo = get_algorithm("shm")
    algo._run(buf, comm, 1)
    expected = (torch.arange(numel) % 500 * world_size + 100 * sum(range(world_size))).double()
    exact = bool(torch.equal(buf.double(), expected))
    window = shm._window(comm)
    return (
        [float(buf[0]), float(buf[-1])],
        comm.traffic.messages_sent,
        (exact and window.slot_bytes == shm.MIN_WINDOW_BYTES and not os.path.exists(window.path)),
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize("world_size", [2, 3])  # two pairs of slots in turns; a share each
def test_a_message_larger_than_the_window_goes_through_it_in_turns(
    world_size: int, dtype: torch.dtype
) -> None:
    got = run_local(_many_turns, world_size, dtype)
    firsts = {tuple(g[0]) for g in got}
    assert len(firsts) == 1  # every rank holds the same values
    assert [g[1] for g in got] == [4] * world_size  # three full turns and one of 5 elements
    assert all(g[2] for g in got)  # exact sums, the smallest slot, its file unlinked


def _offered(rank: int, world_size: int, how: str, tmp: str) -> bool:
    if how == "two nodes":
        os.environ[NODE_ID_ENV] = f"node-{rank}"
    elif how == "own /dev/shm":  # a container per rank, on one host name
        shm.SHM_DIR = os.path.join(tmp, str(rank))
        os.makedirs(shm.SHM_DIR)
    elif how == "no room":
        shm.MIN_WINDOW_BYTES = 1 << 60
    cls = type(get_algorithm("shm"))
    device = torch.device("cuda" if how == "cuda" else "cpu")
    if how == "cuda":  # what the check says for CUDA tensors, without a GPU to make them
        assert dist.group.WORLD is not None
        return cls.offered(dist.group.WORLD, device)
    return cls.offered(p2p_group(), device)


@pytest.mark.parametrize(
    ("how", "offered"),
    [("one host", True), ("two nodes", False), ("own /dev/shm", False), ("no room", False),
     ("cuda", False)],
)  # fmt: skip
def test_offered_only_where_every_rank_maps_the_same_shared_memory(
    tmp_path: Path, how: str, offered: bool
) -> None:
    assert run_local(_offered, 2, how, str(tmp_path)) == [offered, offered]
    if how == "own /dev/shm":
        assert not list(tmp_path.rglob("autotune-*"))  # the probe file is gone


def _shm_error() -> str:
    """What `shm` raises (a RuntimeError) for a 10-element all-reduce here, or "no error"."""
    try:
        get_algorithm("shm").all_reduce(torch.ones(10))
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def _full(rank: int, world_size: int) -> str:
    shm.MIN_WINDOW_BYTES = 1 << 60
    return _shm_error()


def test_a_full_dev_shm_is_an_error_on_every_rank_not_a_crash() -> None:
    for message in run_local(_full, 2):
        assert "/dev/shm has room for" in message and "leave 'shm' out" in message


def _one_stays_away(rank: int, world_size: int, how: str) -> str:
    algo = get_algorithm("shm")
    algo.timeout_s = 1.0
    t = torch.ones(1000)
    algo.all_reduce(t)
    assert float(t[0]) == world_size
    if rank == 1:
        if how == "alive":  # stays, in a barrier of the world's, until rank 0 has its error
            dist.barrier()
        return "away"
    try:
        algo.all_reduce(t)
    except PeerError as exc:
        return f"{exc} (peer {exc.peer})"
    finally:
        if how == "alive":
            dist.barrier()
    return "no error"


@pytest.mark.parametrize("how", ["alive", "exited"])
def test_a_peer_that_never_comes_is_a_peer_error(how: str) -> None:
    got = run_local(_one_stays_away, 2, how)
    assert got[1] == "away"
    assert "shm all-reduce" in got[0] and "the other ranks' writes in shared memory" in got[0]
    assert got[0].endswith("(peer 1)")
    if how == "alive":  # after the timeout
        assert "did not finish within 0:00:01: rank(s) 1 never came" in got[0]
    else:  # at once: its ends of the pipes closed with it
        assert "rank 1 closed its pipe (it exited or died)" in got[0]


def _ahead(rank: int, world_size: int) -> list[int]:
    """A barrier's promise: nobody leaves barrier k before everyone has come to it. Every rank
    says in the store how far it came, and sleeps a random while between barriers, so that some
    run ahead to the next one while others still read this one's bytes."""
    group = p2p_group()
    comm = Comm(group, dist.get_rank(group), world_size, "gloo", "shm", timedelta(seconds=60))
    prefix = os.path.join(shm.SHM_DIR, f"autotune-test-{os.getppid()}")
    barrier = PipeBarrier.open(comm, prefix)
    store = dist.distributed_c10d._get_default_store()
    behind: list[int] = []
    g = torch.Generator().manual_seed(rank)
    for k in range(40):
        store.set(f"came-{rank}", str(k))
        time.sleep(float(torch.rand(1, generator=g)) * 0.004)
        barrier.wait(comm, "a test")
        came = [int(store.get(f"came-{p}")) for p in range(world_size)]
        behind.extend(c for c in came if c < k)
    barrier.wait(comm, "the end")
    barrier.close()
    return behind


def test_no_rank_leaves_a_pipe_barrier_before_every_rank_came() -> None:
    assert run_local(_ahead, 3) == [[], [], []]
    assert not list(Path(shm.SHM_DIR).glob(f"autotune-test-{os.getpid()}*"))  # pipes unlinked


def _no_pipes(rank: int, world_size: int) -> str:
    if rank == 1:

        def refused(path: object, mode: int = 0o666, **_: object) -> None:
            raise PermissionError(13, "Permission denied", path)

        os.mkfifo = refused
    return _shm_error()


def test_pipes_that_cannot_be_made_are_an_error_on_every_rank() -> None:
    got = run_local(_no_pipes, 2)
    assert "could not make pipes under /dev/shm/autotune-shm-" in got[0]
    assert got[0].endswith(" on another rank")
    assert "[Errno 13] Permission denied" in got[1]


def test_nothing_is_left_in_dev_shm() -> None:
    before = {p.name for p in Path(shm.SHM_DIR).glob("autotune-*")}
    results = launch(_many_turns, 2, torch.float64)
    assert all(r.ok for r in results)
    # Other tests' windows may come and go meanwhile; none of this job's stays.
    assert {p.name for p in Path(shm.SHM_DIR).glob("autotune-*")} <= before


def _scaled(rank: int, world_size: int, name: str) -> bool:
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(100_003, generator=g)
    folded, first = x.clone(), x.clone().mul_(1.0 / world_size)
    algo = get_algorithm(name)
    algo.all_reduce(folded, scale=1.0 / world_size)
    algo.all_reduce(first)
    return torch.equal(folded, first) and (world_size == 1 or not torch.equal(folded, x))


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("name", ["shm", "ring"])  # folded into the copy; scaled first
def test_a_scale_is_bitwise_the_input_scaled_first(name: str, world_size: int) -> None:
    # The hook's 1/N: shm folds it into the copy into its slot, a pass over the bucket fewer.
    assert run_local(_scaled, world_size, name) == [True] * world_size


def _left_in_the_window(rank: int, world_size: int) -> dict[str, bool]:
    shm.MAX_WINDOW_BYTES = shm.MIN_WINDOW_BYTES  # slots of 256 KiB: a result area of 1 MiB
    algo = get_algorithm("shm")
    group = p2p_group()

    def message(numel: int, seed: int, on: int) -> torch.Tensor:
        # Integers: every order of summing gives the same float32 sum.
        return (torch.arange(numel) % 97 + on * 10 + seed).float()

    def total(numel: int, seed: int) -> torch.Tensor:
        return sum((message(numel, seed, r) for r in range(world_size)), torch.zeros(numel))

    area_bytes = shm.RESULT_SLOTS * shm.MIN_WINDOW_BYTES
    out: dict[str, bool] = {}
    # An iteration of three messages (12,000 bytes, under half the area): each sum is left in
    # the window, the inputs untouched, and none overwrites another.
    inputs = [message(1000, seed, rank) for seed in range(3)]
    results = []
    for seed, x in enumerate(inputs):
        pending = algo.start(x, group, leave_within=12_000)
        assert pending.traffic is not None
        results.append(pending.traffic.result)
        out[f"input {seed} untouched"] = torch.equal(x, message(1000, seed, rank))
    out["every sum left"] = all(r is not None for r in results)
    out["every sum exact"] = all(
        r is not None and torch.equal(r, total(1000, seed)) for seed, r in enumerate(results)
    )
    ptrs = sorted(r.data_ptr() for r in results if r is not None)
    out["apart"] = all(b - a >= 4000 for a, b in itertools.pairwise(ptrs))
    # A scale is folded as in place: bitwise the input scaled first.
    x = message(1000, 7, rank)
    pending = algo.start(x, group, scale=1 / 3, leave_within=12_000)
    assert pending.traffic is not None and pending.traffic.result is not None
    first = message(1000, 7, rank).mul_(1 / 3)
    algo.all_reduce(first)
    out["scaled bitwise"] = torch.equal(pending.traffic.result, first)
    # Where twice the caller's bytes would not fit in the area, or the message itself would
    # not (a message of 1.2 MB goes through the window in turns), the sum is in the input.
    for name, numel, within in [("half", 1000, area_bytes), ("large", 300_000, 1_200_000)]:
        x = message(numel, 9, rank)
        pending = algo.start(x, group, leave_within=within)
        assert pending.traffic is not None
        out[f"{name}: in place"] = pending.traffic.result is None and torch.equal(
            x, total(numel, 9)
        )
    # Messages go on taking the area in turn, and come back to its start where one would not
    # fit at its end.
    window = shm._window(Comm(group, dist.get_rank(group), world_size, "gloo", "shm", None))
    start = window.results(world_size, torch.float32).data_ptr()
    seen = set()
    for seed in range(12):  # 12 x 100 KB: past the 1 MiB area's end
        pending = algo.start(message(25_000, seed, rank), group, leave_within=100_000)
        assert pending.traffic is not None and pending.traffic.result is not None
        seen.add(pending.traffic.result.data_ptr() - start)
        out[f"exact {seed}"] = torch.equal(pending.traffic.result, total(25_000, seed))
    out["came round"] = 0 in seen and max(seen) + 100_000 <= area_bytes
    return out


def test_a_sum_is_left_in_the_window_for_a_caller_that_takes_it_there() -> None:
    # DDP copies a hook's result into the gradients: taken from the window, it saves shm's
    # copy of the whole result into the bucket (`Comm.leave_within`).
    for got in run_local(_left_in_the_window, 3):
        assert got == dict.fromkeys(got, True), got


def _staged(rank: int, world_size: int) -> dict[str, bool]:
    shm.MAX_WINDOW_BYTES = shm.MIN_WINDOW_BYTES  # slots of 256 KiB, a result area of 1 MiB
    algo = get_algorithm("shm")
    group = p2p_group()
    out: dict[str, bool] = {}
    parts = [(torch.arange(n) % 50 + rank).float() for n in (100, 900)]  # two "buckets"
    slot = algo.stage(group, 4000, torch.float32, leave_within=8000)
    out["a slot"] = slot is not None and slot.numel() == 1000
    assert slot is not None
    slot[:100], slot[100:] = parts[0] / 4, parts[1] / 4  # gathered, scaled, by the caller
    pending = algo.start(slot, group, leave_within=8000)
    assert pending.traffic is not None and pending.traffic.result is not None
    expected = sum(
        (torch.cat([torch.arange(n) % 50 + r for n in (100, 900)]).float() / 4 for r in range(3)),
        torch.zeros(1000),
    )
    out["exact"] = torch.equal(pending.traffic.result, expected)
    # No slot where the sum would not be left, or the message would not fit one turn.
    out["none past half the area"] = algo.stage(group, 4000, torch.float32, 1 << 20) is None
    out["none past a slot"] = algo.stage(group, 1 << 20, torch.float32, 1 << 20) is None
    return out


def test_a_caller_may_gather_its_message_straight_into_its_slot() -> None:
    # The engine gathers a fused message's buckets, scaled, into the slot shm would copy it
    # into: one pass where a concatenation and shm's copy of it were two.
    for got in run_local(_staged, 3):
        assert got == dict.fromkeys(got, True), got
    assert run_local(_stage_of_two, 2) == [True, True]


def _stage_of_two(rank: int, world_size: int) -> bool:
    # Of 2 ranks the sum goes into the input (both sum it whole): nothing to stage.
    return get_algorithm("shm").stage(p2p_group(), 4000, torch.float32, 8000) is None


def _dies_making_its_window(rank: int, world_size: int, where: str) -> str:
    """Rank 0 dies once it has made and reserved the window's file, before anyone mapped it."""
    shm.SHM_DIR = where
    if rank == 0:
        reserve = os.posix_fallocate

        def then_die(fd: int, offset: int, length: int) -> None:
            reserve(fd, offset, length)
            os._exit(9)

        os.posix_fallocate = then_die
    algo = get_algorithm("shm")
    algo.timeout_s = 2.0
    try:
        algo.all_reduce(torch.ones(1000))
    except (PeerError, RuntimeError) as exc:
        return type(exc).__name__
    return "no error"


def test_a_dead_jobs_window_is_swept(tmp_path: Path) -> None:
    # A crashed job's 64 MiB window used to stay in /dev/shm until reboot. Its name carries the
    # time after which its maker would have unlinked it, were it alive; sweep removes it then
    # (the next window's rank 0 sweeps, and a rank whose group failed).
    results = launch(_dies_making_its_window, 2, str(tmp_path), timeout_s=60)
    assert not results[0].ok and results[1].ok
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith("autotune-shm-"), left
    (tmp_path / "autotune-shm-notes.txt").write_text("not ours")  # no deadline: never ours
    shm.SHM_DIR = str(tmp_path)
    try:
        assert shm.sweep() == []  # not stale yet: a live job may still be mapping it
        deadline = int(left[0].removeprefix("autotune-shm-").partition("-")[0])
        assert time.time() + 2.0 < deadline <= time.time() + 2.0 + 61  # its timeout, + 60 s
        assert shm.sweep(now=deadline + 1) == left
    finally:
        shm.SHM_DIR = "/dev/shm"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autotune-shm-notes.txt"]
