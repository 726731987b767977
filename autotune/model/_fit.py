"""Fit the model's prices to measured all-reduce times (`autotune sweep --json` results).

``base`` per all-reduce, ``alpha`` per message and ``beta`` per byte sent on a link, ``gamma``
per byte summed, shared by every algorithm, each counted from its schedule
(`autotune.model.schedule`). Where some samples span nodes (a sweep across nodes: its
``node_of``), the links inside a node and between nodes get prices of their own, six in all;
otherwise one link is fitted and stands for both. Least squares on relative error, since the
times span five orders of magnitude; every price held at zero or above (an exact non-negative
solution: every subset of the unknowns is tried). `native` rows count where the sweep ran on
gloo (its ring is modelled); NCCL's are left out.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from autotune.model._cost import DEFAULT_SEGMENT_BYTES, Link, Params, Shape, predict
from autotune.model._schedule import MODELLED

__all__ = ["Fit", "Sample", "fit"]


@dataclass(frozen=True)
class Sample:
    """One measured all-reduce: ``seconds`` for ``nbytes`` with ``algorithm`` over ``ranks``."""

    algorithm: str
    nbytes: int
    ranks: int
    seconds: float
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    ranks_per_node: int | None = None  # None: one node

    @property
    def shape(self) -> Shape:
        return Shape(self.ranks, self.ranks_per_node or self.ranks)


@dataclass(frozen=True)
class Fit:
    """The fitted prices and, per sample, the predicted seconds."""

    params: Params
    samples: tuple[Sample, ...]
    predicted: tuple[float, ...]

    @property
    def errors(self) -> tuple[float, ...]:
        """Per sample, predicted / measured - 1 (signed)."""
        return tuple(p / s.seconds - 1.0 for s, p in zip(self.samples, self.predicted, strict=True))

    def median_error(self, algorithm: str | None = None) -> float:
        """Median of |predicted / measured - 1| (over one algorithm, or all)."""
        return statistics.median(abs(e) for e in self._errors(algorithm))

    def worst_error(self, algorithm: str | None = None) -> float:
        return max(abs(e) for e in self._errors(algorithm))

    def _errors(self, algorithm: str | None) -> list[float]:
        out = [
            e
            for s, e in zip(self.samples, self.errors, strict=True)
            if algorithm is None or s.algorithm == algorithm
        ]
        if not out:
            raise ValueError(f"no samples of {algorithm!r}")
        return out


_NO_LINK = Link(0.0, 0.0)
#: One price at 1 and the others at 0, in the fit's order (base, alpha, beta, gamma on one link;
#: base, alpha and beta inside a node, alpha and beta between nodes, gamma on two): `predict`
#: is linear in the prices, so at each it gives that price's coefficient for a sample.
_ONE_LINK = (
    Params(_NO_LINK, _NO_LINK, base_s=1.0),
    Params(Link(1.0, 0.0), Link(1.0, 0.0)),
    Params(Link(0.0, 1.0), Link(0.0, 1.0)),
    Params(_NO_LINK, _NO_LINK, gamma_s_per_byte=1.0),
)
_TWO_LINKS = (
    Params(_NO_LINK, _NO_LINK, base_s=1.0),
    Params(Link(1.0, 0.0), _NO_LINK),
    Params(Link(0.0, 1.0), _NO_LINK),
    Params(_NO_LINK, Link(1.0, 0.0)),
    Params(_NO_LINK, Link(0.0, 1.0)),
    Params(_NO_LINK, _NO_LINK, gamma_s_per_byte=1.0),
)


def fit(samples: Sequence[Sample]) -> Fit:
    """The prices that predict ``samples`` with the least squared relative error: one link's
    where every sample is on one node, else a link inside nodes and one between them."""
    usable = [s for s in samples if s.algorithm in MODELLED and s.ranks > 1 and s.nbytes > 0]
    if len(usable) < 4:
        raise ValueError(
            f"need at least 4 measurements of modelled algorithms ({', '.join(MODELLED)}) over "
            f"2 ranks or more, got {len(usable)}"
        )
    units = _TWO_LINKS if any(s.shape.nodes > 1 for s in usable) else _ONE_LINK
    x = torch.tensor(
        [
            [predict(s.algorithm, s.nbytes, s.shape, p, s.segment_bytes) for p in units]
            for s in usable
        ],
        dtype=torch.float64,
    )
    t = torch.tensor([s.seconds for s in usable], dtype=torch.float64)
    a, b = x / t[:, None], torch.ones_like(t)  # relative error: (x @ theta) / t - 1
    best: tuple[float, torch.Tensor] | None = None
    columns = range(x.shape[1])
    for k in range(1, len(columns) + 1):
        for subset in itertools.combinations(columns, k):
            sol = torch.linalg.lstsq(a[:, list(subset)], b[:, None]).solution[:, 0]
            if (sol < 0).any():
                continue
            theta = torch.zeros(x.shape[1], dtype=torch.float64)
            theta[list(subset)] = sol
            residual = float(((a @ theta - b) ** 2).sum())
            if best is None or residual < best[0]:
                best = (residual, theta)
    assert best is not None  # a one-column fit is never negative: features and targets are not
    prices = [float(v) for v in best[1]]
    if units is _ONE_LINK:
        base, alpha, beta, gamma = prices
        params = Params(Link(alpha, beta), Link(alpha, beta), gamma, base)
    else:
        base, a_in, b_in, a_out, b_out, gamma = prices
        params = Params(Link(a_in, b_in), Link(a_out, b_out), gamma, base)
    return Fit(params, tuple(usable), tuple(float(v) for v in x @ best[1]))
