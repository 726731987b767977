"""The cost model's arithmetic by hand, and its counts against the schedules the algorithms run."""

from __future__ import annotations

import pytest

from autotune.algorithms import binary_tree, double_binary_tree, split
from autotune.algorithms._trees import _tree_rounds
from autotune.model import Link, Params, Shape, bytes_sent, predict, schedule

MIB = 1 << 20
US, NS = 1e-6, 1e-9


def test_two_ranks_on_one_node_by_hand() -> None:
    params = Params(intra=Link(10 * US, 1 * NS), inter=Link(1.0, 1.0), gamma_s_per_byte=0.5 * NS)
    one_node = Shape(2, 2)
    a, b, g = 10 * US, 1 * NS, 0.5 * NS
    s, seg = 8 * MIB, 4 * MIB

    def cost(name: str) -> float:
        return predict(name, s, one_node, params, segment_bytes=seg)

    # Ring: chunks of 4 MiB, one segment each; one step sums, one copies.
    assert cost("ring") == pytest.approx(2 * a + 2 * 4 * MIB * b + 4 * MIB * g)
    # Tree 0 -> 1: two 4 MiB segments; up in rounds 0-1, down in 1-2.
    assert cost("tree") == pytest.approx(3 * a + 3 * 4 * MIB * b + 2 * 4 * MIB * g)
    # Two trees of 4 MiB each, one segment: each rank sends up one tree and down the other.
    assert cost("two_tree") == pytest.approx(2 * a + 2 * 8 * MIB * b + 1 * 4 * MIB * g)
    assert cost("direct") == pytest.approx(a + 8 * MIB * b + 8 * MIB * g)
    assert cost("star") == pytest.approx(2 * a + 2 * 8 * MIB * b + 8 * MIB * g)


def test_eight_ranks_on_two_nodes_are_priced_on_the_link_between_them() -> None:
    params = Params(
        intra=Link(1 * US, 0.1 * NS), inter=Link(10 * US, 1 * NS), gamma_s_per_byte=0.5 * NS
    )
    a, b, g = 10 * US, 1 * NS, 0.5 * NS
    s, seg = 8 * MIB, 1 * MIB
    two_nodes, one_node = Shape(8, 4), Shape(8, 8)
    assert two_nodes.nodes == 2 and one_node.nodes == 1
    # Ring: 2(N-1) = 14 steps of a 1 MiB chunk, 7 of them summing.
    ring = 14 * (a + 1 * MIB * b) + 7 * 1 * MIB * g
    # Tree on 8 (0 -> 4 -> {2, 6} -> leaves): height 3, 8 segments, 8 - 1 + 2 * 3 = 13 rounds;
    # an interior rank sends 3 segments a round (up one, down two) and sums 2.
    tree = 13 * (a + 3 * MIB * b) + 10 * 2 * MIB * g
    # Two trees of 4 MiB: 4 segments, 4 - 1 + 6 = 9 rounds; the busiest rank is interior in one
    # tree (3 segments out) and a leaf in the other (1), and sums 2.
    two_tree = 9 * (a + 4 * MIB * b) + 6 * 2 * MIB * g
    for name, expected in (("ring", ring), ("tree", tree), ("two_tree", two_tree)):
        assert predict(name, s, two_nodes, params, seg) == pytest.approx(expected), name
    # The same on one node is priced on the faster link inside it.
    fast = Params(intra=params.inter, inter=Link(1.0, 1.0), gamma_s_per_byte=g)
    assert predict("ring", s, one_node, fast, seg) == pytest.approx(ring)
    assert predict("ring", s, one_node, params, seg) < ring


def _rounds_the_trees_run(name: str, n: int, numel: int, seg: int) -> tuple[int, int]:
    """Rounds of the schedule `run_trees` runs over every rank, and how many of them sum."""
    if name == "tree":
        plan = [(binary_tree(n), (0, numel))]
    else:
        plan = list(zip(double_binary_tree(n), split(0, numel, 2), strict=True))
    busy, summing = set(), set()
    for rank in range(n):
        for channel, (tree, span) in enumerate(plan):
            for i, (sends, recvs) in _tree_rounds(tree, rank, span, seg, channel).items():
                if sends or recvs:
                    busy.add(i)
                if any(r.reduce for r in recvs):
                    summing.add(i)
    assert busy == set(range(len(busy)))  # no idle round in between
    return len(busy), len(summing)


@pytest.mark.parametrize("name", ["tree", "two_tree"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 12, 16])
@pytest.mark.parametrize("segments", [1, 3])
def test_tree_rounds_are_the_rounds_the_algorithm_runs(name: str, n: int, segments: int) -> None:
    seg_elems = 64
    numel = 2 * segments * seg_elems  # tree: 2 * segments segments; two_tree: segments each
    counted = schedule(name, numel * 4, n, seg_elems * 4)
    assert (counted.rounds, counted.reduce_rounds) == _rounds_the_trees_run(
        name, n, numel, seg_elems
    )


def test_one_rank_or_no_bytes_costs_nothing_and_bad_input_is_refused() -> None:
    params = Params(intra=Link(1.0, 1.0), inter=Link(1.0, 1.0))
    assert predict("ring", 1 << 20, Shape(1, 1), params) == 0.0
    assert predict("tree", 0, Shape(4, 4), params) == 0.0
    assert bytes_sent("star", 0, 1, 100) == 0.0
    with pytest.raises(ValueError, match="no cost model for 'native'"):
        schedule("native", 1 << 20, 4, 1 << 20)
    with pytest.raises(ValueError, match="ranks"):
        Shape(0, 1)
    with pytest.raises(ValueError, match=">= 0"):
        Link(-1.0, 0.0)
