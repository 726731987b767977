"""Prices for a schedule: alpha (per message), beta (per byte) inside a node and between nodes,
gamma (per byte summed); and the prediction that puts them on `autotune.model.schedule`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.algorithms import AllReduceAlgorithm
from autotune.model._schedule import Schedule, schedule

__all__ = ["DEFAULT_SEGMENT_BYTES", "Link", "Params", "Shape", "predict"]

#: The segment the algorithms use when none is given.
DEFAULT_SEGMENT_BYTES = AllReduceAlgorithm.default_segment_bytes


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
    """A machine's prices: ``intra`` between ranks of a node, ``inter`` between nodes,
    ``gamma_s_per_byte`` to sum a byte, and ``base_s`` once per all-reduce (launching it)."""

    intra: Link
    inter: Link
    gamma_s_per_byte: float = 0.0
    base_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.gamma_s_per_byte >= 0 and self.base_s >= 0):
            raise ValueError(f"gamma and base must be >= 0, got {self}")


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

    Latency is summed along the longest chain of dependent messages, each hop at its own link's
    alpha (as NCCL's tuning model sums its ring's and tree's hops); every further round of the
    pipeline adds one message at the slowest link's alpha. The bytes go at the slowest link's
    beta: in the steady state every link carries a round at once, and with ranks on more than
    one node some of them cross nodes (ranks in node order).
    """
    plan = schedule(
        name, nbytes, shape.ranks, segment_bytes or DEFAULT_SEGMENT_BYTES, shape.ranks_per_node
    )
    if plan.rounds == 0 and plan.local is None:
        return 0.0  # one rank, or nothing to send: no collective runs
    slow = params.inter if shape.nodes > 1 else params.intra
    local = 0.0 if plan.local is None else _price(plan.local, params, params.intra)
    return params.base_s + _price(plan, params, slow) + local


def _price(plan: Schedule, params: Params, slow: Link) -> float:
    """``plan``'s latency and transfer at ``slow``'s prices (hops on its chain at their own)."""
    return (
        (plan.chain_hops - plan.inter_hops) * params.intra.alpha_s
        + plan.inter_hops * params.inter.alpha_s
        + (plan.rounds - plan.chain_hops) * slow.alpha_s
        + plan.rounds * plan.round_bytes * slow.beta_s_per_byte
        + plan.reduce_rounds * plan.reduce_bytes * params.gamma_s_per_byte
    )
