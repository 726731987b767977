"""The tree constructions: spanning, binary, shallow, and complementary in the two-tree."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autotune.algorithms import (
    Tree,
    binary_tree,
    double_binary_tree,
    node_double_binary_tree,
    render,
)

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
    doc = (Path(__file__).parents[2] / "docs" / "ALGORITHMS.md").read_text()
    for size in (7, 8):
        for tree in double_binary_tree(size):
            assert render(tree) in doc, f"docs/ALGORITHMS.md is missing the N={size} drawing"


def test_render() -> None:
    assert render(binary_tree(4)) == "0\n└── 2\n    ├── 1\n    └── 3"


NODE_LAYOUTS = [
    [[0, 1], [2, 3]],
    [[0, 1, 2], [3, 4, 5]],
    [[0, 1], [2, 3], [4, 5]],
    [[0], [1, 2]],
    [[0, 2], [1, 3]],
]


@pytest.mark.parametrize("members", NODE_LAYOUTS)
def test_node_trees_cross_nodes_once_per_tree_edge_and_chain_inside(
    members: list[list[int]],
) -> None:
    size = sum(len(m) for m in members)
    node_of = {r: k for k, m in enumerate(members) for r in m}
    node_trees = double_binary_tree(len(members))
    for t, (tree, node_tree) in enumerate(
        zip(node_double_binary_tree(members), node_trees, strict=True)
    ):
        check_spanning_binary_tree_or_chain(tree, size)
        head = [m[-1] if t else m[0] for m in members]
        # Between nodes: exactly the node tree's edges, each from one node's head to another's.
        crossing = {(node_of[c], node_of[r]) for r in range(size) for c in tree.children[r]}
        crossing = {(c, p) for c, p in crossing if c != p}
        assert crossing == {(k, p) for k, p in enumerate(node_tree.parent) if p is not None}
        for r in range(size):
            p = tree.parent[r]
            if p is not None and node_of[p] != node_of[r]:
                assert r == head[node_of[r]] and p == head[node_of[p]]

    # The two trees leave each node from different ranks where it has more than one.
    def linking(tree: Tree) -> set[int]:
        return {
            r
            for r in range(size)
            for other in [tree.parent[r], *tree.children[r]]
            if other is not None and node_of[other] != node_of[r]
        }

    first, second = node_double_binary_tree(members)
    for m in members:
        if len(m) > 1:
            assert not linking(first) & linking(second) & set(m)


def check_spanning_binary_tree_or_chain(tree: Tree, size: int) -> None:
    """Spanning and acyclic; a node's head may hold its chain and two other nodes' heads."""
    assert tree.size == size
    assert tree.parent.count(None) == 1
    for r in range(size):
        assert len(tree.children[r]) <= 3
        for c in tree.children[r]:
            assert tree.parent[c] == r
    seen = {tree.root}
    frontier = [tree.root]
    while frontier:
        frontier = [c for r in frontier for c in tree.children[r]]
        assert not seen & set(frontier)
        seen |= set(frontier)
    assert seen == set(range(size))


def test_node_trees_on_one_node_are_the_flat_two_tree() -> None:
    assert node_double_binary_tree([[0, 1, 2, 3, 4]]) == double_binary_tree(5)
    # One rank per node: the node trees are the rank trees.
    assert node_double_binary_tree([[0], [1], [2]]) == double_binary_tree(3)
