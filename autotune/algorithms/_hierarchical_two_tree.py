"""Two-tree across nodes, as NCCL 2.4 builds it: a double binary tree over the nodes, with the
ranks of each node in a chain, so each tree crosses between nodes only from one rank per node.
"""

from __future__ import annotations

import torch

from autotune.algorithms._base import AllReduceAlgorithm
from autotune.algorithms._transport import split
from autotune.algorithms._trees import node_double_binary_tree, run_trees
from autotune.comm import topology
from autotune.comm.groups import Comm

__all__ = ["HierarchicalTwoTreeAllReduce"]


class HierarchicalTwoTreeAllReduce(AllReduceAlgorithm):
    """`two_tree`'s schedule on NCCL's trees across nodes (`node_double_binary_tree`).

    Each tree carries half the buffer, pipelined by segments; inside a node the segments walk a
    chain, between nodes a binary tree of nodes, whose complement the other tree is. Only a
    node's first rank (first tree) and last rank (second) talk to other nodes. On one node, or
    with one rank per node, it is `two_tree` itself.
    """

    name = "hierarchical_two_tree"
    flat_twin = "two_tree"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        trees = node_double_binary_tree(topology.detect(comm.group, comm.timeout).members)
        halves = split(0, buf.numel(), 2)
        plan = [(tree, span) for tree, span in zip(trees, halves, strict=True) if span[1] > span[0]]
        run_trees(buf, comm, plan, segment_elems)
