"""Deliberately broken algorithms: the conformance suite must catch each of them."""

from __future__ import annotations

import torch

from autotune.algorithms import Comm, RingAllReduce
from autotune_baselines import DirectAllReduce


class LosesLastElement(RingAllReduce):
    """A ring that never reduces the last element: a wrong sum."""

    name = "loses_last_element"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        if buf.numel() > 1:
            super()._run(buf[:-1], comm, segment_elems)


class OwnInputFirst(DirectAllReduce):
    """Direct all-reduce, but every rank starts the sum from its own input: right to within
    rounding, but ranks add in different orders, so they disagree bitwise."""

    name = "own_input_first"

    def _sum(self, buf: torch.Tensor, inputs: torch.Tensor, me: int) -> None:
        for p, row in enumerate(inputs):
            if p != me:
                buf.add_(row)
