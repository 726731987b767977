"""Live tuning: whole plans judged on the training step against the baseline (`campaign`, `duel`),
per-class searches that nominate challengers (`search`, Optuna through `sampler`), the thread that
runs Optuna (`worker`), the cross-rank exchange (`wire`), and the orchestration (`tuner`)."""

from autotune.tuning.search import Progress
from autotune.tuning.tuner import FUSION_OPTIONS, Tuner

__all__ = ["FUSION_OPTIONS", "Progress", "Tuner"]
