"""Prices for a schedule: alpha (per message), beta (per byte) inside a node and between nodes,
gamma (per byte summed); and the prediction that puts them on `autotune.model.schedule`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.model._schedule import schedule

__all__ = ["Link", "Params", "Shape", "predict"]

#: The segment the Python-driven algorithms use when none is given
#: (`AllReduceAlgorithm.default_segment_bytes`).
DEFAULT_SEGMENT_BYTES = 4 << 20


@dataclass(frozen=True)
class Link:
    """One hop: ``alpha_s`` seconds per message, ``beta_s_per_byte`` seconds per byte."""

    alpha_s: float
    beta_s_per_byte: float

    def __post_init__(self) -> None:
        if not (self.alpha_s >= 0 and self.beta_s_per_byte >= 0):
            raise ValueError(f"a link's costs must be >= 0, got {self}")


@dataclass(frozen=True)
class Params:
    """A machine's prices: ``intra`` between ranks of a node, ``inter`` between nodes, and
    ``gamma_s_per_byte`` to sum a byte."""

    intra: Link
    inter: Link
    gamma_s_per_byte: float = 0.0


@dataclass(frozen=True)
class Shape:
    """``ranks`` in all, ``ranks_per_node`` of them on each node (the last may hold fewer)."""

    ranks: int
    ranks_per_node: int

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.ranks_per_node < 1:
            raise ValueError(f"ranks and ranks_per_node must be >= 1, got {self}")

    @property
    def nodes(self) -> int:
        return math.ceil(self.ranks / self.ranks_per_node)


def predict(
    name: str,
    nbytes: int,
    shape: Shape,
    params: Params,
    segment_bytes: int | None = None,
) -> float:
    """Seconds to all-reduce ``nbytes`` with algorithm ``name`` over ``shape``.

    A round takes as long as its slowest hop. In the steady state of these pipelined schedules
    every round moves data over every hop they use, and with ranks on more than one node some of
    those hops cross nodes (ranks in node order), so every round is priced on ``inter`` there.
    For a tree's first and last rounds, where fewer hops are busy, that is an upper bound.
    """
    plan = schedule(name, nbytes, shape.ranks, segment_bytes or DEFAULT_SEGMENT_BYTES)
    link = params.inter if shape.nodes > 1 else params.intra
    return (
        plan.rounds * (link.alpha_s + link.beta_s_per_byte * plan.round_bytes)
        + plan.reduce_rounds * plan.reduce_bytes * params.gamma_s_per_byte
    )
