"""The live tuner's sampler: Optuna records what the tuner decided to try, and decides nothing.

The tuner tries every option of a study once, in its own order, skipping what other jobs sharing
the study have measured or are measuring. A sampler that decides from the study's trials
(BruteForceSampler) breaks when another job's half-suggested trial is in the study ("param_name
mismatch") and cannot tell a live job's running trial from a dead one's. Imported lazily: it
imports Optuna.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

__all__ = ["GivenSampler"]


class GivenSampler(optuna.samplers.BaseSampler):
    """Returns ``params[name]`` for each parameter of the next trial; set ``params`` first."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        if param_name not in self.params:
            raise KeyError(f"the tuner gave no value for parameter {param_name!r}")
        return self.params[param_name]
