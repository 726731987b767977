"""The one sampler seam: Optuna records what a tuner decided to try, and decides nothing.

Both the live tuner and ``autotune sweep --tune`` open their studies with `open_study` and ask
trials with `ask`, each choosing the options itself: the live tuner tries each once, in its own
order, skipping what other jobs sharing the study have measured or are measuring; the sweep asks
a class's options at once and measures them interleaved. A sampler that decides from the
study's trials (BruteForceSampler) breaks when another job's half-suggested trial is in the
study ("param_name mismatch") and cannot tell a live job's running trial from a dead one's.
Imported lazily: it imports Optuna.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

if TYPE_CHECKING:
    from autotune.storage import Store

__all__ = ["GivenSampler", "ask", "open_study"]

T = TypeVar("T", bound=Hashable)


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


def open_study(store: Store, key: str, what: str) -> optuna.Study:
    """The study ``what`` of fingerprint ``key``, with the sampler every tuner records through."""
    return store.study(key, what, GivenSampler())


def ask(
    study: optuna.Study,
    option: T,
    params: dict[str, Any],
    suggest: Callable[[optuna.Trial], T],
) -> optuna.Trial:
    """A new trial of ``study`` for ``option``, the choice the tuner made.

    ``params`` are the values `GivenSampler` hands out; ``suggest`` asks them of the trial (the
    study records a parameter only when it is suggested, define-by-run) and must give ``option``
    back.
    """
    sampler = study.sampler
    if not isinstance(sampler, GivenSampler):
        raise TypeError(f"studies are opened with open_study, not with {type(sampler).__name__}")
    sampler.params = params
    trial = study.ask()
    got = suggest(trial)
    if got != option:
        raise RuntimeError(f"trial parameters {params!r} read back as {got!r}, not {option!r}")
    return trial
