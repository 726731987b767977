"""How buckets become messages (`autotune.ddp.messages`): fusing, cutting, staging, reading back."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import torch

from autotune.algorithms import Pending, Traffic
from autotune.algorithms._base import gathered
from autotune.ddp.messages import (
    Bucket,
    Message,
    Piece,
    at_storage_start,
    joins,
    leave_within,
    piece_bounds,
    piece_sizes,
    pieces,
    stage,
)
from autotune.plan import Choice


def bucket(numel: int, dtype: torch.dtype = torch.float32, iteration: int = 1) -> Bucket:
    return Bucket(torch.arange(numel, dtype=dtype), torch.futures.Future(), False, iteration)


def test_a_bucket_joins_the_pending_ones_only_within_the_limit_and_alike() -> None:
    pending = [bucket(100), bucket(100)]  # 800 bytes
    assert joins([], bucket(10_000), 0)  # nothing pending: nothing to flush
    assert joins(pending, bucket(100), 1200)
    assert not joins(pending, bucket(101), 1200)  # 1204 bytes
    assert not joins(pending, bucket(1), 0)  # fusion off
    assert not joins(pending, bucket(1, torch.float64), 4096)


@pytest.mark.parametrize(("numel", "limit"), [(1000, 4000), (1000, 1024), (1001, 1000), (7, 4)])
def test_pieces_are_near_equal_cover_the_message_and_stay_within_the_limit(
    numel: int, limit: int
) -> None:
    bounds = piece_bounds(numel, 4, limit)
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a == b for (_, a), (b, _) in pairwise(bounds))
    sizes = piece_sizes(numel * 4, 4, limit)
    assert sum(sizes) == numel * 4 and all(s <= limit for s in sizes)
    assert max(sizes) - min(sizes) <= 4  # near-equal: one element apart at most
    assert len(sizes) == -(-numel * 4 // limit)
    flat = torch.arange(numel, dtype=torch.float32)
    assert torch.equal(torch.cat(pieces(flat, limit)), flat)


def test_no_limit_or_a_small_message_is_one_piece() -> None:
    assert piece_bounds(1000, 4, 0) == [(0, 1000)]
    assert piece_bounds(1000, 4, 4000) == [(0, 1000)]


def test_a_slice_reads_back_from_its_own_storage_start() -> None:
    flat = torch.arange(10.0)
    part = at_storage_start(flat[3:7])
    assert part.storage_offset() == 0 and part.data_ptr() == flat[3:].data_ptr()
    assert torch.equal(part.as_strided((4,), (1,), 0), torch.tensor([3.0, 4.0, 5.0, 6.0]))
    assert at_storage_start(flat) is flat


def test_a_fused_message_hands_each_bucket_its_part() -> None:
    buckets = [bucket(3), bucket(2)]
    message = Message(buckets, torch.tensor([9.0, 8.0, 7.0, 6.0, 5.0]))
    message.hand_back()
    assert [b.result.tolist() for b in buckets if b.result is not None] == [
        [9.0, 8.0, 7.0],
        [6.0, 5.0],
    ]
    alone = bucket(3)
    Message([alone], alone.buffer).hand_back()
    assert alone.result is None  # the sum is in its own buffer


def test_the_sum_may_be_left_within_an_iteration_once_the_layout_is_known() -> None:
    layout = [(400, "float32"), (100, "float32")]
    assert leave_within(bucket(1, iteration=0), layout) is None
    assert leave_within(bucket(1, iteration=3), layout) == 500


class Staging:
    """An algorithm that leaves its result in memory of its own, as `shm` does."""

    leaves_result = True

    def __init__(self) -> None:
        self.asked: list[tuple[Any, ...]] = []
        self.slot = torch.zeros(64)

    def stage(self, group: Any, nbytes: int, dtype: torch.dtype, within: int) -> torch.Tensor:
        self.asked.append((group, nbytes, dtype, within))
        return self.slot[: nbytes // 4]

    def gather(
        self, group: Any, parts: list[torch.Tensor], flat: torch.Tensor, scale: float
    ) -> None:
        # As the base class does (`shm` may leave it to its start instead).
        self.asked.append(("gather", len(parts), scale))
        gathered(parts, flat, scale)


def test_a_whole_message_is_gathered_scaled_into_the_algorithms_memory() -> None:
    algo = Staging()
    buckets = [bucket(3), bucket(5)]
    flat = stage(buckets, algo, "group", 96, 4, 0)  # type: ignore[arg-type]
    assert flat is not None and flat.data_ptr() == algo.slot.data_ptr()
    assert flat.tolist() == [x / 4 for x in [0, 1, 2, 0, 1, 2, 3, 4]]
    assert algo.asked == [("group", 32, torch.float32, 96), ("gather", 2, 0.25)]
    # Cut into pieces by the fusion size, or an algorithm that copies nothing: not staged.
    assert stage(buckets, algo, "group", 96, 4, 16) is None  # type: ignore[arg-type]
    algo.leaves_result = False
    assert stage(buckets, algo, "group", 96, 4, 0) is None  # type: ignore[arg-type]


def test_a_piece_takes_what_its_traffic_says() -> None:
    choice = Choice("ring", 4096)
    traffic = Traffic(bytes_sent=12, first_wait_s=0.5, wait_s=1.5)
    piece = Piece.started_by(256, choice, Pending(traffic=traffic), 10.0, 11.0)
    assert (piece.first_wait_s, piece.sent_bytes, piece.wait_s) == (0.5, 12, 1.5)
    record = piece.record(0.25, 7, 3)
    assert (record.size_class, record.nbytes, record.algorithm, record.segment_bytes) == (
        256,
        256,
        "ring",
        4096,
    )
    assert (record.seconds, record.iteration, record.world_size, record.timer) == (
        0.25,
        7,
        3,
        "host",
    )
    bare = Piece.started_by(256, choice, Pending(), 10.0, None)
    assert (bare.first_wait_s, bare.sent_bytes, bare.wait_s) == (None, None, None)
