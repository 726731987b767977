"""Bad input gets a clear error naming the problem, before any rank sends a byte."""

from __future__ import annotations

import pytest
import torch

from autotune.algorithms import AllReduceAlgorithm, available, get_algorithm


@pytest.fixture(params=["native", "ring", "tree", "two_tree", "direct", "star"])
def algo(request: pytest.FixtureRequest) -> AllReduceAlgorithm:
    return get_algorithm(request.param)


@pytest.mark.parametrize(
    ("tensor", "error", "words"),
    [
        (torch.arange(8, dtype=torch.int64), TypeError, "dtype torch.int64"),
        (torch.ones(8, dtype=torch.int32), TypeError, "dtype torch.int32"),
        (torch.ones(8, dtype=torch.bool), TypeError, "dtype torch.bool"),
        (torch.ones(8, dtype=torch.complex64), TypeError, "dtype torch.complex64"),
        (torch.ones(4, 4).t(), ValueError, "contiguous"),
        (torch.ones(8)[::2], ValueError, "contiguous"),
        (torch.eye(3).to_sparse(), TypeError, "dense"),
        (torch.ones(8, device="meta"), ValueError, "device meta"),
        ([1.0, 2.0], TypeError, "torch.Tensor"),
    ],
)
def test_bad_tensor(
    algo: AllReduceAlgorithm, tensor: object, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        algo.all_reduce(tensor)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("segment_bytes", "error"),
    [(0, ValueError), (-4, ValueError), (1.5, TypeError), (True, TypeError), ("1M", TypeError)],
)
def test_bad_segment_bytes(
    algo: AllReduceAlgorithm, segment_bytes: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="segment_bytes"):
        algo.all_reduce(torch.ones(8), segment_bytes=segment_bytes)  # type: ignore[arg-type]


def test_unknown_algorithm_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown algorithm 'rign'") as info:
        get_algorithm("rign")
    for name in available():
        assert name in str(info.value)


@pytest.mark.parametrize("timeout_s", [0, -1.0])
def test_bad_timeout(timeout_s: float) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        get_algorithm("ring", timeout_s=timeout_s)
