"""A Python-driven algorithm sums on its own thread alone, whatever torch's intra-op threads.

With torch's default of one intra-op thread per core, each ``add_`` of a ring's segment was an
OpenMP parallel region whose threads then spun on cores that gloo and the other ranks needed: the
ring ran at 0.65x native at 16 MiB on 2 ranks and 2 cores, 1.10-1.15x with this
(docs/BENCHMARKS.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from autotune.algorithms import RingAllReduce, get_algorithm
from autotune.algorithms._threads import _openmp, one_thread
from autotune.comm.groups import Comm
from autotune.comm.launch import run_local


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_torch_runs_on_openmp_here() -> None:
    # The CPU wheels for Linux do; if this fails, one_thread does nothing on this build.
    assert _openmp() is not None, torch.__config__.parallel_info()


def test_one_thread_holds_for_the_calling_thread_only(two_threads: None) -> None:
    seen: dict[str, int] = {}

    def other() -> None:
        seen["other thread, meanwhile"] = torch.get_num_threads()

    with one_thread():
        seen["inside"] = torch.get_num_threads()
        t = threading.Thread(target=other)
        t.start()
        t.join()
    seen["after"] = torch.get_num_threads()
    assert seen == {"inside": 1, "other thread, meanwhile": 2, "after": 2}


class Counting(RingAllReduce):
    name = "counting"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        self.threads = torch.get_num_threads()


def test_a_python_driven_algorithm_runs_with_one_intra_op_thread(two_threads: None) -> None:
    algo = Counting()
    algo._start(torch.ones(8), None, 8)  # type: ignore[arg-type]  # _run ignores the comm
    assert algo.threads == 1
    assert torch.get_num_threads() == 2


def _ring(rank: int, world_size: int, numel: int) -> tuple[int, bool]:
    tensor = torch.arange(numel, dtype=torch.float32) * (rank + 1)
    get_algorithm("ring").all_reduce(tensor, segment_bytes=64 << 10)
    expected = torch.arange(numel, dtype=torch.float32) * sum(range(1, world_size + 1))
    return torch.get_num_threads(), torch.equal(tensor, expected)


@pytest.mark.distributed
def test_the_ring_is_exact_on_ranks_with_two_intra_op_threads() -> None:
    results = run_local(_ring, 2, 1 << 20, threads=2, timeout_s=120)
    assert results == [(2, True), (2, True)]
