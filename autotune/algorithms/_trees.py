"""Binary trees over ranks and the pipelined reduce-then-broadcast schedule that runs on them.

`binary_tree` is the in-order tree NCCL uses; `double_binary_tree` adds its complement (Sanders,
Speck and Träff 2009): the mirror image for even N, a shift by one for odd N, so a rank that is a
leaf in one tree is interior in the other.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from autotune.algorithms._transport import Recv, Send, Transport, segments
from autotune.comm.groups import Comm

__all__ = [
    "Tree",
    "binary_tree",
    "double_binary_tree",
    "node_double_binary_tree",
    "render",
    "run_trees",
]


@dataclass(frozen=True)
class Tree:
    """A rooted spanning tree over ranks ``0..size-1``: each rank's parent and children."""

    parent: tuple[int | None, ...]
    children: tuple[tuple[int, ...], ...]

    @property
    def size(self) -> int:
        return len(self.parent)

    @property
    def root(self) -> int:
        return self.parent.index(None)

    @cached_property
    def height(self) -> tuple[int, ...]:
        """Hops from each rank down to its deepest leaf (0 at a leaf)."""
        h = [0] * self.size
        for r in reversed(self._top_down):
            h[r] = 1 + max((h[c] for c in self.children[r]), default=-1)
        return tuple(h)

    @cached_property
    def depth(self) -> tuple[int, ...]:
        """Hops from the root to each rank (0 at the root)."""
        d = [0] * self.size
        for r in self._top_down:
            for c in self.children[r]:
                d[c] = d[r] + 1
        return tuple(d)

    @cached_property
    def _top_down(self) -> list[int]:
        order = [self.root]
        for r in order:
            order.extend(self.children[r])
        return order


def binary_tree(size: int, rank_at: Callable[[int], int] = lambda p: p) -> Tree:
    """The in-order binary tree on positions ``0..size-1``, position ``p`` held by ``rank_at(p)``.

    A position's lowest set bit ``b`` says its level: its children are ``p - b/2`` and the
    farthest of ``p + b/2, p + b/4, ...`` still inside the world. Position 0 is the root, with one
    child, the largest power of two below ``size``. Odd positions are the leaves.
    """
    if size < 1:
        raise ValueError(f"a tree needs at least one rank, got size={size}")
    parent: list[int | None] = [None] * size
    children: list[list[int]] = [[] for _ in range(size)]

    def attach(p: int, child: int) -> None:
        children[rank_at(p)].append(rank_at(child))
        parent[rank_at(child)] = rank_at(p)

    top = 1
    while top < size:
        top *= 2
    stack = [(0, top)]  # (position, its lowest set bit; the root's is the span above the world)
    while stack:
        p, bit = stack.pop()
        half = bit // 2
        if p > 0 and half >= 1:
            attach(p, p - half)
            stack.append((p - half, half))
        while half >= 1 and p + half >= size:
            half //= 2
        if half >= 1:
            attach(p, p + half)
            stack.append((p + half, half))
    return Tree(tuple(parent), tuple(tuple(c) for c in children))


def double_binary_tree(size: int) -> tuple[Tree, Tree]:
    """Two complementary binary trees: the second mirrors the first (even N) or shifts it (odd N).

    Odd positions are leaves, so mirroring (p -> N-1-p, odd when N is even) turns every leaf of the
    first tree into an interior rank of the second and vice versa; for odd N the shift by one does
    the same for every rank but rank 0, which is interior in both.
    """
    first = binary_tree(size)
    if size % 2 == 0:
        second = binary_tree(size, lambda p: size - 1 - p)
    else:
        second = binary_tree(size, lambda p: (p + 1) % size)
    return first, second


def node_double_binary_tree(members: Sequence[Sequence[int]]) -> tuple[Tree, Tree]:
    """NCCL 2.4's trees across nodes: `double_binary_tree` over the nodes, a chain inside each.

    ``members``: each node's ranks (nodes in order). In the first tree a node's chain runs from
    its first rank, which links to the other nodes; in the second it runs the other way, from
    its last rank, so the two trees cross nodes from different ranks (different NICs, on a real
    node). On one node it is `double_binary_tree` over the ranks: a chain of the whole world
    would be the deepest tree there is.
    """
    size = sum(len(m) for m in members)
    if len(members) == 1:
        return double_binary_tree(size)
    out = []
    for tree, flip in zip(double_binary_tree(len(members)), (False, True), strict=True):
        parent: list[int | None] = [None] * size
        chains = [list(reversed(m)) if flip else list(m) for m in members]
        for k, chain in enumerate(chains):
            up = tree.parent[k]
            parent[chain[0]] = None if up is None else chains[up][0]
            for a, b in itertools.pairwise(chain):
                parent[b] = a
        children: list[list[int]] = [[] for _ in range(size)]
        # Chain first, then the other nodes' heads, in node order: the same on every rank.
        for k, chain in enumerate(chains):
            for a, b in itertools.pairwise(chain):
                children[a].append(b)
            for child in tree.children[k]:
                children[chain[0]].append(chains[child][0])
        out.append(Tree(tuple(parent), tuple(tuple(c) for c in children)))
    return out[0], out[1]


def _tree_rounds(
    tree: Tree, rank: int, span: tuple[int, int], segment_elems: int, channel: int
) -> dict[int, tuple[list[Send], list[Recv]]]:
    """This rank's operations in one tree, by round, for a pipelined reduce then broadcast.

    Segment s goes up from a rank of height h in round s + h, so it has arrived from every child
    (lower heights) by then; the root sends it down in round s + H, and a rank at depth d passes it
    on in round s + H + d. Sender and receiver compute the same round for every message.
    """
    rounds: dict[int, tuple[list[Send], list[Recv]]] = defaultdict(lambda: ([], []))
    parent = tree.parent[rank]
    kids = tree.children[rank]
    top = tree.height[tree.root]
    depth = tree.depth[rank]
    for s, (a, b) in enumerate(segments(*span, segment_elems)):
        for c in kids:
            rounds[s + tree.height[c]][1].append(Recv(c, a, b, reduce=True, channel=channel))
        if parent is not None:
            rounds[s + tree.height[rank]][0].append(Send(parent, a, b, channel=channel))
            rounds[s + top + depth - 1][1].append(Recv(parent, a, b, reduce=False, channel=channel))
        for c in kids:
            rounds[s + top + depth][0].append(Send(c, a, b, channel=channel))
    return rounds


def run_trees(
    buf: torch.Tensor,
    comm: Comm,
    plan: Sequence[tuple[Tree, tuple[int, int]]],
    segment_elems: int,
) -> None:
    """All-reduce ``buf``: each (tree, span) reduces and broadcasts its span, all trees at once."""
    merged: dict[int, tuple[list[Send], list[Recv]]] = defaultdict(lambda: ([], []))
    for channel, (tree, span) in enumerate(plan):
        for i, (sends, recvs) in _tree_rounds(
            tree, comm.rank, span, segment_elems, channel
        ).items():
            merged[i][0].extend(sends)
            merged[i][1].extend(recvs)
    Transport(buf, comm).run([merged[i] for i in sorted(merged)])


def render(tree: Tree) -> str:
    """Draw ``tree`` as indented text, root first (used for docs/ALGORITHMS.md)."""
    lines = [str(tree.root)]

    def walk(r: int, prefix: str) -> None:
        kids = tree.children[r]
        for i, c in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(f"{prefix}{'└── ' if last else '├── '}{c}")
            walk(c, prefix + ("    " if last else "│   "))

    walk(tree.root, "")
    return "\n".join(lines)
