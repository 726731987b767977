"""Fit the model's prices to measured all-reduce times (an `autotune sweep --json` result).

One node only, so one link: ``base`` per all-reduce, ``alpha`` per round, ``beta`` per byte sent
and ``gamma`` per byte summed, shared by every algorithm, each counted from its schedule
(`autotune.model.schedule`). Least squares on relative error, since the times span five orders
of magnitude; every price held at zero or above (an exact non-negative solution: with four
unknowns, every subset of them is tried).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from autotune.model._cost import DEFAULT_SEGMENT_BYTES, Link, Params, Shape, predict
from autotune.model._schedule import MODELLED

if TYPE_CHECKING:
    from autotune.sweep import SweepResult

__all__ = ["Fit", "Sample", "fit", "samples_from_sweep"]


@dataclass(frozen=True)
class Sample:
    """One measured all-reduce: ``seconds`` for ``nbytes`` with ``algorithm`` over ``ranks``."""

    algorithm: str
    nbytes: int
    ranks: int
    seconds: float
    segment_bytes: int = DEFAULT_SEGMENT_BYTES


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


#: One price at 1 and the others at 0, in the fit's order (base, alpha, beta, gamma): `predict`
#: is linear in the prices, so at each it gives that price's coefficient for a sample.
_UNIT_PRICES = (
    Params(Link(0.0, 0.0), Link(0.0, 0.0), base_s=1.0),
    Params(Link(1.0, 0.0), Link(1.0, 0.0)),
    Params(Link(0.0, 1.0), Link(0.0, 1.0)),
    Params(Link(0.0, 0.0), Link(0.0, 0.0), gamma_s_per_byte=1.0),
)


def _features(s: Sample) -> list[float]:
    shape = Shape(s.ranks, s.ranks)
    return [predict(s.algorithm, s.nbytes, shape, p, s.segment_bytes) for p in _UNIT_PRICES]


def fit(samples: Sequence[Sample]) -> Fit:
    """The prices (one node) that predict ``samples`` with the least squared relative error."""
    usable = [s for s in samples if s.algorithm in MODELLED and s.ranks > 1 and s.nbytes > 0]
    if len(usable) < 4:
        raise ValueError(
            f"need at least 4 measurements of modelled algorithms ({', '.join(MODELLED)}) over "
            f"2 ranks or more, got {len(usable)}"
        )
    x = torch.tensor([_features(s) for s in usable], dtype=torch.float64)
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
    theta = best[1]
    base, alpha, beta, gamma = (float(v) for v in theta)
    link = Link(alpha, beta)
    params = Params(intra=link, inter=link, gamma_s_per_byte=gamma, base_s=base)
    return Fit(params, tuple(usable), tuple(float(v) for v in x @ theta))


def samples_from_sweep(result: SweepResult) -> list[Sample]:
    """The modelled algorithms' rows of a sweep's result (one node)."""
    return [
        Sample(
            r.algorithm,
            r.bytes,
            result.world_size,
            r.time_us * 1e-6,
            r.segment_bytes or DEFAULT_SEGMENT_BYTES,
        )
        for r in result.rows
        if r.algorithm in MODELLED and r.time_us > 0
    ]
