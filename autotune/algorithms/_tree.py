"""Binary tree all-reduce: reduce up to the root, broadcast back down, pipelined by segments.

About 2*log2(N) hops of latency, but leaves only ever send or receive, so half the links idle.
"""

from __future__ import annotations

import torch

from autotune.algorithms._base import AllReduceAlgorithm
from autotune.algorithms._trees import binary_tree, run_trees
from autotune.comm.groups import Comm

__all__ = ["TreeAllReduce"]


class TreeAllReduce(AllReduceAlgorithm):
    """Pipelined binary-tree all-reduce over NCCL's in-order tree (root: rank 0).

    Segments stream up while earlier ones stream back down; the root sums every element, so all
    ranks end bitwise identical.
    """

    name = "tree"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        run_trees(buf, comm, [(binary_tree(comm.size), (0, buf.numel()))], segment_elems)
