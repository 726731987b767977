"""Each algorithm sends exactly the bytes per rank that the cost model (and docs/ALGORITHMS.md)
says it does."""

from __future__ import annotations

import pytest
import torch

from autotune.algorithms import get_algorithm
from autotune.comm.launch import run_local
from autotune.model import bytes_sent

pytestmark = pytest.mark.distributed

NAMES = ["ring", "tree", "two_tree", "direct", "star"]


def _traffic(rank: int, world_size: int, numel: int) -> dict[str, tuple[int, int]]:
    out = {}
    for name in NAMES:
        pending = get_algorithm(name).start(torch.ones(numel), segment_bytes=1 << 30)  # 1 segment
        pending.wait()
        assert pending.traffic is not None
        out[name] = (pending.traffic.bytes_sent, pending.traffic.messages_sent)
    # The backend's own collective: nothing of it is observable, and none is claimed.
    native = get_algorithm("native").start(torch.ones(numel))
    native.wait()
    assert native.traffic is None
    return out


@pytest.mark.parametrize("world_size", [2, 3, 5, 8])
def test_bytes_sent_per_rank(world_size: int) -> None:
    numel = 2 * world_size * 96
    got = run_local(_traffic, world_size, numel)
    for rank, per_algo in enumerate(got):
        for name in NAMES:
            sent, _ = per_algo[name]
            assert sent == bytes_sent(name, rank, world_size, numel * 4), (name, rank)
    # The ring's bandwidth optimum: every rank sends the same 2(N-1)/N of the data.
    assert len({per_algo["ring"][0] for per_algo in got}) == 1


def test_ring_message_count() -> None:
    # 2(N-1) steps, one message each when a chunk fits one segment.
    got = run_local(_traffic, 5, 5 * 100)
    assert all(per_algo["ring"][1] == 2 * 4 for per_algo in got)
