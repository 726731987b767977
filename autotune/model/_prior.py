"""The model as the tuner's prior: which choices a size class tries first, and which not at all.

A stored fit (`autotune sweep --tune` writes one per fingerprint) predicts each choice's
time for a class. The tuner tries `native` (the backend's own, the baseline) first, as measured
ground truth, then the rest in that order. It leaves out a choice only where the fit's own error
cannot make it the fastest: with w the fit's worst relative error on its sweep (but native's),
a true time lies within [p / (1 + w), p / (1 - w)] of a prediction p. A choice predicted over
(1 + w) / (1 - w) times the best prediction is then slower at its fastest than the best at its
slowest. With w >= 1 there is no such bound, and nothing is left out. The prior only orders and
prunes: what runs is still decided by measurement. `native` is never left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.model._cost import Link, Params, Shape, predict
from autotune.model._fit import Fit
from autotune.model._schedule import MODELLED
from autotune.plan import Choice

__all__ = ["Prior"]


@dataclass(frozen=True)
class Prior:
    """Fitted prices, and the fit's worst relative error on the sweep it came from."""

    params: Params
    worst_error: float

    @classmethod
    def from_fit(cls, fit: Fit) -> Prior:
        """The fit's prices, and its worst error over the algorithms the prior may leave out:
        `native` is never left out, and on gloo its C++ rounds fit worst of all."""
        prunable = [
            abs(e) for s, e in zip(fit.samples, fit.errors, strict=True) if s.algorithm != "native"
        ]
        return cls(fit.params, max(prunable) if prunable else fit.worst_error())

    @property
    def cut(self) -> float:
        """How many times the best prediction a choice may be predicted and still be tried."""
        w = self.worst_error
        return math.inf if w >= 1 else (1 + w) / (1 - w)

    def order(
        self,
        cls: int,
        ranks: int,
        space: Sequence[Choice],
        keep: Choice,
        prune: bool = True,
        ranks_per_node: int | None = None,
    ) -> list[Choice]:
        """``space`` for size class ``cls`` over ``ranks`` (``ranks_per_node`` a node; None: one
        node): `native` and unmodelled choices first, then by predicted time; without those
        beyond `cut` where ``prune``. ``keep`` (what runs now) always stays."""
        shape = Shape(ranks, ranks_per_node or ranks)
        first = [c for c in space if c.algorithm == "native" or c.algorithm not in MODELLED]
        predicted = {
            c: predict(c.algorithm, cls, shape, self.params, c.segment_bytes)
            for c in space
            if c not in first
        }
        ranked = sorted(predicted, key=lambda c: predicted[c])
        if prune and ranked:
            limit = self.cut * predicted[ranked[0]]
            ranked = [c for c in ranked if predicted[c] <= limit or c == keep]
        return first + ranked

    def to_json(self) -> dict[str, Any]:
        p = self.params
        return {
            "base_s": p.base_s,
            "alpha_s": p.intra.alpha_s,
            "beta_s_per_byte": p.intra.beta_s_per_byte,
            "inter_alpha_s": p.inter.alpha_s,
            "inter_beta_s_per_byte": p.inter.beta_s_per_byte,
            "gamma_s_per_byte": p.gamma_s_per_byte,
            "worst_error": self.worst_error,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Prior:
        """A stored fit; one stored before links between nodes were fitted prices both alike."""
        try:
            intra = Link(float(raw["alpha_s"]), float(raw["beta_s_per_byte"]))
            inter = intra
            if "inter_alpha_s" in raw:
                inter = Link(float(raw["inter_alpha_s"]), float(raw["inter_beta_s_per_byte"]))
            params = Params(intra, inter, float(raw["gamma_s_per_byte"]), float(raw["base_s"]))
            return cls(params, float(raw["worst_error"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a stored cost-model fit: {raw!r} ({exc})") from None
