"""Star all-reduce: gather every buffer at rank 0, sum there, send the sum back to everyone."""

from __future__ import annotations

import torch

from autotune.algorithms import AllReduceAlgorithm, Comm, Recv, Round, Send, Transport

__all__ = ["StarAllReduce"]

ROOT = 0


class StarAllReduce(AllReduceAlgorithm):
    """Single-master all-reduce: rank 0 receives and sends (N-1)·S bytes, so it sets the pace.

    Rank 0 adds the inputs in rank order as they are applied, then sends the one sum everywhere.
    """

    name = "star"
    segmented = False

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        n = buf.numel()
        rounds: list[Round]
        if comm.rank == ROOT:
            peers = range(1, comm.size)
            rounds = [([], [Recv(p, 0, n) for p in peers]), ([Send(p, 0, n) for p in peers], [])]
        else:
            rounds = [([Send(ROOT, 0, n)], []), ([], [Recv(ROOT, 0, n, reduce=False)])]
        Transport(buf, comm).run(rounds)
