"""Double binary tree all-reduce (Sanders, Speck and Träff 2009; NCCL 2.4): half the data per tree.

Each rank is a leaf in one tree and interior in the other, so links run both ways at once: tree
latency with close to ring bandwidth.
"""

from __future__ import annotations

import torch

from autotune.algorithms._base import AllReduceAlgorithm
from autotune.algorithms._transport import split
from autotune.algorithms._trees import double_binary_tree, run_trees
from autotune.comm.groups import Comm

__all__ = ["TwoTreeAllReduce"]


class TwoTreeAllReduce(AllReduceAlgorithm):
    """Two complementary pipelined trees, each reducing and broadcasting half the buffer.

    Both trees' segments share every round, so one tree's reduce traffic runs while the other's
    broadcast uses the opposite direction of the same links.
    """

    name = "two_tree"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        trees = double_binary_tree(comm.size)
        halves = split(0, buf.numel(), 2)
        plan = [(tree, span) for tree, span in zip(trees, halves, strict=True) if span[1] > span[0]]
        run_trees(buf, comm, plan, segment_elems)
