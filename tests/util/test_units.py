"""Sizes and counts as the CLI, logs and verdicts say them."""

from __future__ import annotations

import pytest

from autotune.plan import Buckets, Gain
from autotune.util.units import count, format_bytes, parse_bytes


def test_a_count_takes_its_noun_in_the_right_number() -> None:
    # A verdict said "1 pairs of blocks".
    assert [count(n, "pair") for n in (0, 1, 2)] == ["0 pairs", "1 pair", "2 pairs"]
    assert count(1, "child", "children") == "1 child" and count(3, "child", "children") == (
        "3 children"
    )
    assert Gain(0.9, 0.8, 1.0, 1).over("blocks") == "0.90x over 1 pair of blocks"
    assert Buckets(4 << 20, Gain(0.82, 0.7, 0.9, 12)).describe() == (
        "DDP's buckets at 4 MiB (0.82x over 12 pairs of blocks)"
    )


@pytest.mark.parametrize(("text", "nbytes"), [("4M", 4 << 20), ("8K", 8192), ("512", 512)])
def test_sizes_read_back_as_they_are_written(text: str, nbytes: int) -> None:
    assert parse_bytes(text) == nbytes
    assert parse_bytes(format_bytes(nbytes).replace(" ", "").replace("iB", "")) == nbytes
