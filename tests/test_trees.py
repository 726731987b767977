"""The tree constructions: spanning, binary, shallow, and complementary in the two-tree."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autotune.algorithms import Tree, binary_tree, double_binary_tree, render

SIZES = list(range(1, 70))


def interior(tree: Tree) -> set[int]:
    return {r for r in range(tree.size) if tree.children[r]}


def check_spanning_binary_tree(tree: Tree, size: int) -> None:
    assert tree.size == size
    assert tree.parent.count(None) == 1
    for r in range(size):
        assert len(tree.children[r]) <= 2
        for c in tree.children[r]:
            assert tree.parent[c] == r
    # Every rank reaches the root: connected and acyclic.
    seen = {tree.root}
    frontier = [tree.root]
    while frontier:
        frontier = [c for r in frontier for c in tree.children[r]]
        assert not seen & set(frontier)
        seen |= set(frontier)
    assert seen == set(range(size))


@pytest.mark.parametrize("size", SIZES)
def test_binary_tree_spans_and_is_shallow(size: int) -> None:
    tree = binary_tree(size)
    check_spanning_binary_tree(tree, size)
    assert tree.root == 0
    # Reduce and broadcast each take ceil(log2 N) hops: the tree's latency term.
    assert max(tree.depth) == (math.ceil(math.log2(size)) if size > 1 else 0)
    assert tree.height[tree.root] == max(tree.depth)
    # Odd positions are the leaves.
    assert interior(tree) == {r for r in range(size) if r % 2 == 0 and (r > 0 or size > 1)}


@pytest.mark.parametrize("size", SIZES)
def test_double_tree_is_complementary(size: int) -> None:
    first, second = double_binary_tree(size)
    check_spanning_binary_tree(first, size)
    check_spanning_binary_tree(second, size)
    both = interior(first) & interior(second)
    if size % 2 == 0:
        # Mirror: every rank is interior in exactly one tree (a leaf in the other).
        assert both == set()
        assert interior(first) | interior(second) == set(range(size))
        assert second.root == size - 1
    elif size > 1:
        # Shift: the same for every rank except rank 0, interior in both.
        assert both == {0}
        assert interior(first) | interior(second) == set(range(size))
        assert second.root == 1


def test_known_shape_for_eight_ranks() -> None:
    tree = binary_tree(8)
    assert tree.children[0] == (4,)
    assert sorted(tree.children[4]) == [2, 6]
    assert sorted(tree.children[2]) == [1, 3]
    assert sorted(tree.children[6]) == [5, 7]
    assert tree.parent[7] == 6


def test_docs_show_the_trees_the_code_builds() -> None:
    # docs/ALGORITHMS.md draws the two-tree for N=7 and N=8; keep the drawings honest.
    doc = (Path(__file__).parents[1] / "docs" / "ALGORITHMS.md").read_text()
    for size in (7, 8):
        for tree in double_binary_tree(size):
            assert render(tree) in doc, f"docs/ALGORITHMS.md is missing the N={size} drawing"


def test_render() -> None:
    assert render(binary_tree(4)) == "0\n└── 2\n    ├── 1\n    └── 3"
